package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/storage"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// gateway is a running gateway: its listeners serve the routes of the
// configuration loaded last.
type gateway struct {
	file  string
	cfg   *Config // the running configuration; changed only by run's goroutine
	log   *slog.Logger
	level *slog.LevelVar

	store   *openedStore
	traced  storage.Store // store, reported to tel
	tel     *idemotel.Telemetry
	metrics http.Handler
	current atomic.Pointer[routes]
	ready   atomic.Bool // routes loaded, not shutting down
	retired sync.WaitGroup
}

func newGateway(file string, cfg *Config, logOut io.Writer) (*gateway, error) {
	g := &gateway{file: file, cfg: cfg, level: new(slog.LevelVar)}
	lvl, _ := logLevel(cfg.Log.Level) // validated
	g.level.Set(lvl)
	g.log = slog.New(slog.NewJSONHandler(logOut, &slog.HandlerOptions{Level: g.level}))
	// Metrics: idemotel's instruments, exported to Prometheus from a
	// registry of the gateway's own (with the Go runtime's and the
	// process's collectors), served on the admin listener's /metrics.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	g.tel, err = idemotel.New(idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))))
	if err != nil {
		return nil, err
	}
	g.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	return g, nil
}

// ServeHTTP serves a request with the routes loaded last.
func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.current.Load().mux.ServeHTTP(w, r)
}

// run serves until ctx ends, reloading on each value of hup; then it
// shuts down within the configuration's grace.
func (g *gateway) run(ctx context.Context, hup <-chan os.Signal) error {
	var admin *http.Server
	if g.cfg.Admin.Address != "" {
		ln, err := net.Listen("tcp", g.cfg.Admin.Address)
		if err != nil {
			return fmt.Errorf("admin listener: %w", err)
		}
		admin = &http.Server{Handler: g.adminHandler(), ReadHeaderTimeout: 5 * time.Second}
		go admin.Serve(ln)
		defer admin.Close()
		g.log.Info("admin listening", "addr", ln.Addr().String())
	}

	store, err := openStore(ctx, &g.cfg.Store, g.log)
	if err != nil {
		return err
	}
	g.store = store
	defer store.close()
	g.traced = g.tel.Store(store)
	rs, err := buildRoutes(ctx, g.cfg, g.traced, g.tel, g.log)
	if err != nil {
		return err
	}
	g.current.Store(rs)

	var servers []*http.Server
	var serving sync.WaitGroup
	serveErr := make(chan error, len(g.cfg.Listen))
	for i, l := range g.cfg.Listen {
		ln, err := net.Listen("tcp", l.Address)
		if err != nil {
			for _, s := range servers {
				s.Close()
			}
			return fmt.Errorf("listen[%d]: %w", i, err)
		}
		srv := &http.Server{
			Handler:           g,
			ReadHeaderTimeout: l.ReadHeaderTimeout,
			IdleTimeout:       l.IdleTimeout,
			ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
		}
		if l.TLS != nil {
			cert, err := tls.LoadX509KeyPair(l.TLS.Cert, l.TLS.Key)
			if err != nil {
				ln.Close()
				return fmt.Errorf("listen[%d].tls: %w", i, err)
			}
			// ServeTLS offers HTTP/2 and HTTP/1.1 (ALPN h2 and http/1.1);
			// Serve on a tls.NewListener would offer neither, and speak
			// HTTP/1.1 only.
			srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
		}
		servers = append(servers, srv)
		serving.Add(1)
		go func() {
			defer serving.Done()
			serve := srv.Serve
			if srv.TLSConfig != nil {
				serve = func(ln net.Listener) error { return srv.ServeTLS(ln, "", "") }
			}
			if err := serve(ln); !errors.Is(err, http.ErrServerClosed) {
				serveErr <- fmt.Errorf("listen[%d]: %w", i, err)
			}
		}()
		g.log.Info("listening", "listener", i, "addr", ln.Addr().String(), "tls", l.TLS != nil)
	}
	g.ready.Store(true)
	g.log.Info("ready", "store", store.kind, "routes", len(g.cfg.Routes), "config", g.file)

	var failed error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-hup:
			g.reload()
		case failed = <-serveErr:
			break loop
		}
	}

	// Shut down: stop accepting and wait for the requests in flight, then
	// for their records, then close the store (deferred).
	g.ready.Store(false)
	grace := g.cfg.Shutdown
	g.log.Info("shutting down", "grace", grace)
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	var errs []error
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, s := range servers {
		wg.Go(func() {
			if err := s.Shutdown(sctx); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("requests in flight: %w", err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	serving.Wait()
	errs = append(errs, g.current.Load().close(sctx))
	g.retired.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	g.log.Info("stopped")
	return failed
}

// reload loads the file again and, when it is valid and changes only what
// a reload may change, serves its routes; the routes it replaces are shut
// down once the requests they serve have ended.
func (g *gateway) reload() {
	cfg, err := loadConfig(g.file)
	if err != nil {
		g.log.Error("reload refused: the file does not load; the running configuration is kept", "err", err.Error())
		return
	}
	for _, f := range []struct {
		name     string
		old, new any
	}{
		{"listen", g.cfg.Listen, cfg.Listen},
		{"admin", g.cfg.Admin, cfg.Admin},
		{"store", g.cfg.Store, cfg.Store},
		{"instances", g.cfg.Instances, cfg.Instances},
	} {
		if !reflect.DeepEqual(f.old, f.new) {
			g.log.Error("reload refused: "+f.name+" changed, which only a restart applies; the running configuration is kept", "field", f.name)
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rs, err := buildRoutes(ctx, cfg, g.traced, g.tel, g.log)
	if err != nil {
		g.log.Error("reload refused; the running configuration is kept", "err", err.Error())
		return
	}
	lvl, _ := logLevel(cfg.Log.Level)
	g.level.Set(lvl)
	old := g.current.Swap(rs)
	g.cfg = cfg
	g.log.Info("reloaded", "routes", len(cfg.Routes), "config", g.file)
	grace := cfg.Shutdown
	g.retired.Go(func() {
		// Requests that took the old routes before the swap finish on
		// them; Shutdown waits for their records.
		ctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		if err := old.close(ctx); err != nil {
			g.log.Error("the replaced routes did not finish", "err", err.Error())
		}
	})
}

// adminHandler serves /healthz, /readyz and /metrics.
func (g *gateway) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", g.metrics)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if !g.ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "not ready: starting or shutting down\n")
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if err := g.store.ping(ctx); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "not ready: the store does not answer\n")
			return
		}
		io.WriteString(w, "ok\n")
	})
	return mux
}
