// Command dynamodb is an order service on Amazon DynamoDB that creates each
// order once per Idempotency-Key, even when the process dies between
// writing the order and storing its response.
//
//	go run ./examples/dynamodb -endpoint http://localhost:8000         # serve on localhost:8080, on DynamoDB Local or dynalite
//	go run ./examples/dynamodb -endpoint http://localhost:8000 -demo   # run a scripted client against it, then exit
//	go run ./examples/dynamodb -region eu-west-1 -table orders_idem    # on AWS: the default credential chain, tables made beforehand
//
// A local DynamoDB API to run it on, either of:
//
//	npx dynalite --port 8000   # dynalite (Node.js), in memory
//	docker run --rm -p 8000:8000 amazon/dynamodb-local -jar DynamoDBLocal.jar -inMemory -sharedDb   # DynamoDB Local
//
// -endpoint defaults to $IDEM_DYNAMODB_ENDPOINT; without one the service
// talks to AWS, with the credentials and region of the default chain
// (environment, shared config, the task's or instance's role). With an
// endpoint and no AWS_ACCESS_KEY_ID or AWS_PROFILE in the environment it
// signs with dummy credentials, which dynalite and DynamoDB Local accept;
// -region defaults to $AWS_REGION, else us-east-1 with an endpoint.
//
// idem's entries are in the table -table (storage/dynamostore, default
// idem_keys), the orders in the table -orders (default orders). -create,
// on by default with an endpoint and off against AWS, creates both unless
// they exist; on AWS they belong to the infrastructure's code: idem's as
// the CloudFormation or Terraform of storage/dynamostore's package
// documentation shows, the orders' with the partition key id, a string.
// Either way the service checks both at startup (store.Ping), and a missing
// table stops it with a message that says so.
//
//	POST /orders   {"item":"book","amount":12}, with an Idempotency-Key (required)
//	-> 201 {"order":"3q2-7wEjRbCfT0nUTpSPdA","item":"book","amount":12,"created_at":"2025-06-01T10:00:00.123456Z"}, Location: /orders/3q2-7wEjRbCfT0nUTpSPdA
//	GET /orders/3q2-7wEjRbCfT0nUTpSPdA  -> 200, the same body
//
// An order's id is the request's idem.Info.StorageKey (a hash of the
// principal's scope, the method, the route and the key: the same for every
// retry), and the handler writes it with a PutItem conditioned on
// attribute_not_exists(id). That is the second line of defence that
// storage/dynamostore's documentation asks for, since DynamoDB offers no
// fence in the application's own write: when the process dies after the
// PutItem and before idem stores the response, the retry (once the dead
// execution's lease has run out) runs the handler again, its PutItem fails
// its condition, and the handler answers the order that exists, with the
// same 201 and body, instead of creating a second. The condition also keeps
// a key to one order once idem has forgotten the key (its TTL): the same
// order is answered again, or 409 when the request asks for another item
// or amount.
//
// With -demo the service serves on a free loopback port, runs package
// democlient's script and a burst of identical requests against itself,
// shows the orders of each key by scanning the orders table (a Scan: meant
// for a local table, not a large one), and exits with status 1 unless every
// answer was the promised one and each key has one order.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/democlient"
	"github.com/idemkit/idem/nethttp"
	"github.com/idemkit/idem/storage/dynamostore"
)

// config is what run needs: the flags, and the tables (the tests' own).
type config struct {
	addr             string
	endpoint, region string
	table, orders    string // idem's table, the orders table
	create, demo     bool
}

func main() {
	log.SetFlags(0)
	c := config{}
	flag.StringVar(&c.addr, "addr", "localhost:8080", "listen address")
	flag.StringVar(&c.endpoint, "endpoint", "", "URL of a DynamoDB API, such as DynamoDB Local's or dynalite's http://localhost:8000 (default $IDEM_DYNAMODB_ENDPOINT; none: AWS)")
	flag.StringVar(&c.region, "region", "", "AWS region (default $AWS_REGION, else us-east-1 with -endpoint, else the shared config's)")
	flag.StringVar(&c.table, "table", dynamostore.DefaultTable, "idem's table")
	flag.StringVar(&c.orders, "orders", "orders", "the orders table")
	flag.BoolVar(&c.create, "create", false, "create both tables unless they exist (default true with -endpoint, false against AWS)")
	flag.BoolVar(&c.demo, "demo", false, "serve on a free port, run a scripted client against it, and exit")
	flag.Parse()
	if c.endpoint == "" {
		c.endpoint = os.Getenv("IDEM_DYNAMODB_ENDPOINT")
	}
	createSet := false
	flag.Visit(func(f *flag.Flag) { createSet = createSet || f.Name == "create" })
	if !createSet {
		c.create = c.endpoint != ""
	}
	if err := run(c, os.Stdout, os.Stderr); err != nil {
		log.Fatal(err)
	}
}

// run serves until SIGINT or SIGTERM (with c.demo, on a free port while
// the scripted client writes its transcript to out), logging idem's
// decisions and DynamoDB's errors to logw, then shuts down in the order a
// deploy needs: the server, then the middleware.
func run(c config, out, logw io.Writer) error {
	if c.table == c.orders {
		return fmt.Errorf("idem's table and the orders table are both %q", c.orders)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := connect(ctx, c)
	if err != nil {
		return err
	}
	s, err := open(ctx, db, c, democlient.NewClicks(), log.New(logw, "", 0))
	if err != nil {
		return err
	}
	m, err := idem.New(s.store, s.options()...)
	if err != nil {
		return err
	}
	if c.demo {
		c.addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s.routes(m), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	var failed error
	if c.demo {
		failed = demo(out, "http://"+ln.Addr().String(), s, c.endpoint)
	} else {
		log.Printf("listening on http://%s; try:\n  curl -i -X POST http://%[1]s/orders -H 'Content-Type: application/json' -H 'Idempotency-Key: order-1' -d '{\"item\":\"book\",\"amount\":12}'", ln.Addr())
		sig, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		<-sig.Done()
		stop()
	}
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return errors.Join(failed, srv.Shutdown(ctx), m.Shutdown(ctx))
}

// connect returns a DynamoDB client for c: the default chain's credentials
// and region (config.LoadDefaultConfig), c's region when given, and with
// c.endpoint that endpoint, signed with dummy credentials unless the
// environment names some.
func connect(ctx context.Context, c config) (*dynamodb.Client, error) {
	region := c.region
	if region == "" {
		region = os.Getenv("AWS_REGION")
	}
	if region == "" && c.endpoint != "" {
		region = "us-east-1" // dynalite ignores it; DynamoDB Local keeps a database per region unless -sharedDb
	}
	var opts []func(*awsconfig.LoadOptions) error
	if region != "" {
		opts = append(opts, awsconfig.WithRegion(region))
	}
	if c.endpoint != "" && os.Getenv("AWS_ACCESS_KEY_ID") == "" && os.Getenv("AWS_PROFILE") == "" {
		// dynalite and DynamoDB Local want requests signed, with any keys.
		opts = append(opts, awsconfig.WithCredentialsProvider(aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", Source: "examples/dynamodb"}, nil
		})))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("loading the AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, errors.New("no AWS region: give -region, set AWS_REGION, or name one in ~/.aws/config; " +
			"or give -endpoint http://localhost:8000 for DynamoDB Local or dynalite (or set IDEM_DYNAMODB_ENDPOINT)")
	}
	db := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		if c.endpoint != "" {
			o.BaseEndpoint = aws.String(c.endpoint)
		}
	})
	return db, nil
}

// service is the order service: idem's entries and the orders, each in a
// table of its own.
type service struct {
	db     *dynamodb.Client
	store  *dynamostore.Store
	orders string             // the orders table
	clicks *democlient.Clicks // the demo's double click (package democlient); a copied service drops it
	log    *log.Logger        // idem's decisions and DynamoDB's errors
}

// open makes the service on c's tables: it creates them with c.create
// unless they exist, then checks both, so that a missing table, a wrong
// region or missing permissions stop the service here, not as a 503 on
// every request.
func open(ctx context.Context, db *dynamodb.Client, c config, clicks *democlient.Clicks, logger *log.Logger) (*service, error) {
	store, err := dynamostore.New(db, dynamostore.WithTable(c.table))
	if err != nil {
		return nil, err
	}
	s := &service{db: db, store: store, orders: c.orders, clicks: clicks, log: logger}
	where := "in region " + db.Options().Region
	if c.endpoint != "" {
		where = "at " + c.endpoint
	}
	if c.create {
		if err := store.CreateTable(ctx); err != nil {
			return nil, fmt.Errorf("creating idem's table %s %s: %w%s", c.table, where, err, hint(c))
		}
		if err := s.createOrders(ctx); err != nil {
			return nil, fmt.Errorf("creating the orders table %s %s: %w%s", c.orders, where, err, hint(c))
		}
	}
	if err := store.Ping(ctx); errors.Is(err, dynamostore.ErrTable) {
		return nil, fmt.Errorf("idem's table %s %s: %w\n"+
			"Pass -create to create it, or create it with the CloudFormation or Terraform of storage/dynamostore's package documentation "+
			"(go doc github.com/idemkit/idem/storage/dynamostore): partition key id (S), TTL on ttl", c.table, where, err)
	} else if err != nil {
		return nil, fmt.Errorf("idem's table %s %s: %w%s", c.table, where, err, hint(c))
	}
	if err := s.pingOrders(ctx); errors.Is(err, errOrdersTable) {
		return nil, fmt.Errorf("the orders table %s %s: %w\n"+
			"Pass -create to create it, or create it in your infrastructure's code: partition key id (S), no sort key, on-demand capacity", c.orders, where, err)
	} else if err != nil {
		return nil, fmt.Errorf("the orders table %s %s: %w%s", c.orders, where, err, hint(c))
	}
	return s, nil
}

// hint is what to check when DynamoDB could not be reached.
func hint(c config) string {
	if c.endpoint != "" {
		return "\nIs DynamoDB Local or dynalite running at " + c.endpoint + "? (npx dynalite --port 8000)"
	}
	return ""
}

// The orders table's partition key and its other attributes.
const (
	attrID     = "id"              // the order's id: the request's idem.Info.StorageKey
	attrItem   = "item"            // S
	attrAmount = "amount"          // N
	attrAt     = "created_at"      // S, RFC 3339 in UTC
	attrKey    = "idempotency_key" // S, the client's key, for people reading the table
)

// errOrdersTable: the orders table is missing or not keyed by id.
var errOrdersTable = errors.New("table not usable")

// createOrders creates the orders table unless it exists (on-demand
// capacity, the partition key id), and waits until it is active.
func (s *service) createOrders(ctx context.Context) error {
	_, err := s.db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(s.orders),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(attrID), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(attrID), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if riu := (*types.ResourceInUseException)(nil); err != nil && !errors.As(err, &riu) {
		return err
	}
	w := dynamodb.NewTableExistsWaiter(s.db, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay, o.MaxDelay = 50*time.Millisecond, 2*time.Second
	})
	return w.Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(s.orders)}, 2*time.Minute)
}

// pingOrders checks that the orders table exists and is keyed by id, a
// string, alone.
func (s *service) pingOrders(ctx context.Context) error {
	out, err := s.db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(s.orders)})
	if rnf := (*types.ResourceNotFoundException)(nil); errors.As(err, &rnf) {
		return fmt.Errorf("%w: it does not exist (%v)", errOrdersTable, err)
	}
	if err != nil {
		return err
	}
	t := out.Table
	ok := t != nil && len(t.KeySchema) == 1 && aws.ToString(t.KeySchema[0].AttributeName) == attrID && t.KeySchema[0].KeyType == types.KeyTypeHash
	for i := 0; ok && i < len(t.AttributeDefinitions); i++ {
		d := t.AttributeDefinitions[i]
		ok = aws.ToString(d.AttributeName) != attrID || d.AttributeType == types.ScalarAttributeTypeS
	}
	if !ok {
		return fmt.Errorf("%w: it must have the partition key %q (a string) alone", errOrdersTable, attrID)
	}
	return nil
}

// options are the middleware's options for this service.
func (s *service) options() []idem.Option {
	return []idem.Option{
		idem.WithRequireKey(), // every order has a key, for its retries: none, 400
		idem.WithObserver(func(ev idem.Event) {
			s.log.Printf("idem: %s %s -> %s %d (%v)", ev.Method, ev.Route, ev.Outcome, ev.Status, ev.Duration.Round(time.Microsecond))
		}),
		idem.WithErrorWriter(s.clicks.WriteError), // idem.WriteProblem, and the demo's double click
	}
}

// routes serves POST /orders behind m, and GET /orders/{id}.
func (s *service) routes(m *idem.Middleware) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /orders", nethttp.Middleware(m)(http.HandlerFunc(s.create)))
	mux.HandleFunc("GET /orders/{id}", s.get)
	return mux
}

// create is POST /orders.
func (s *service) create(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Item   string `json:"item"`
		Amount int    `json:"amount"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		fail(w, r, http.StatusBadRequest, "The body is not a JSON order: "+err.Error()+".", 0)
		return
	}
	if in.Item == "" || len(in.Item) > 200 || in.Amount < 1 || in.Amount > 1_000_000 {
		fail(w, r, http.StatusUnprocessableEntity, "An order has an item of 1 to 200 bytes and an amount from 1 to 1000000.", 0)
		return
	}
	info, _ := idem.FromContext(r.Context())
	if info.StorageKey == "" { // not run by the middleware (WithRequireKey refuses a request without a key)
		fail(w, r, http.StatusBadRequest, "An order needs an Idempotency-Key.", 0)
		return
	}
	s.clicks.Hold(r) // ?slow=1 waits for its duplicate's 409 (democlient)
	o, created, err := s.put(r.Context(), info, in.Item, in.Amount)
	switch {
	case err != nil:
		// A 5xx is not stored: idem releases the key and a retry runs the
		// handler again, whose PutItem finds the order if this one's was
		// written after all.
		s.log.Printf("POST /orders: %v", err)
		fail(w, r, http.StatusServiceUnavailable, "The order could not be saved now. Retry with the same Idempotency-Key.", time.Second)
	case !created && (o.Item != in.Item || o.Amount != in.Amount):
		// Made by a request with this key that idem has forgotten (its
		// TTL): idem's 422 for another body no longer applies.
		fail(w, r, http.StatusConflict, "An order was already created with this idempotency key, for another item or amount.", 0)
	case !created:
		// An execution before this one wrote the order, and its response
		// was not stored (the process died, or idem forgot the key): the
		// same answer again, not a second order.
		s.log.Printf("POST /orders: order %s exists for this key: answered it, created nothing", o.ID)
		writeOrder(w, http.StatusCreated, o)
	default:
		writeOrder(w, http.StatusCreated, o)
	}
}

// put writes the order of the request whose Info is info, unless the key
// has one: a PutItem conditioned on attribute_not_exists(id), the id being
// info.StorageKey. created is false when the key's order existed; o is then
// that order, sent back with the failed condition (DynamoDB) or read again
// (an API that does not send it, as dynalite).
func (s *service) put(ctx context.Context, info idem.Info, item string, amount int) (o order, created bool, err error) {
	o = order{ID: info.StorageKey, Item: item, Amount: amount, CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	av := o.item()
	av[attrKey] = &types.AttributeValueMemberS{Value: info.Key}
	_, err = s.db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           aws.String(s.orders),
		Item:                                av,
		ConditionExpression:                 aws.String("attribute_not_exists(#id)"),
		ExpressionAttributeNames:            map[string]string{"#id": attrID},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	if !errors.As(err, &ccf) {
		return o, err == nil, err
	}
	old := ccf.Item
	if len(old) == 0 {
		if old, err = s.read(ctx, o.ID); err != nil {
			return order{}, false, err
		}
		if old == nil {
			return order{}, false, fmt.Errorf("order %s: the condition failed, and the order is not there", o.ID)
		}
	}
	o, err = parseOrder(old)
	return o, false, err
}

// read is a strongly consistent GetItem of an order; nil when there is
// none.
func (s *service) read(ctx context.Context, id string) (map[string]types.AttributeValue, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.orders),
		Key:            map[string]types.AttributeValue{attrID: &types.AttributeValueMemberS{Value: id}},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, err
	}
	return out.Item, nil
}

// get is GET /orders/{id}.
func (s *service) get(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	av, err := s.read(r.Context(), id)
	var o order
	if err == nil && av != nil {
		o, err = parseOrder(av)
	}
	switch {
	case err != nil:
		s.log.Printf("GET /orders/%s: %v", id, err)
		fail(w, r, http.StatusServiceUnavailable, "The order could not be read now.", time.Second)
	case av == nil:
		fail(w, r, http.StatusNotFound, "No such order.", 0)
	default:
		writeOrder(w, http.StatusOK, o)
	}
}

// order is an order's item, and the API's view of it: a response made of
// the item's attributes only is the same, byte for byte, when read back.
type order struct {
	ID        string    `json:"order"`
	Item      string    `json:"item"`
	Amount    int       `json:"amount"`
	CreatedAt time.Time `json:"created_at"`
}

// item is o's item in the orders table.
func (o order) item() map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		attrID:     &types.AttributeValueMemberS{Value: o.ID},
		attrItem:   &types.AttributeValueMemberS{Value: o.Item},
		attrAmount: &types.AttributeValueMemberN{Value: strconv.Itoa(o.Amount)},
		attrAt:     &types.AttributeValueMemberS{Value: o.CreatedAt.Format(time.RFC3339Nano)},
	}
}

// parseOrder reads an order's item.
func parseOrder(av map[string]types.AttributeValue) (order, error) {
	var o order
	id, ok1 := av[attrID].(*types.AttributeValueMemberS)
	item, ok2 := av[attrItem].(*types.AttributeValueMemberS)
	amount, ok3 := av[attrAmount].(*types.AttributeValueMemberN)
	at, ok4 := av[attrAt].(*types.AttributeValueMemberS)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return o, errors.New("an order's item lacks an attribute, or has one of another type")
	}
	n, err := strconv.Atoi(amount.Value)
	if err != nil {
		return o, fmt.Errorf("order %s: amount: %w", id.Value, err)
	}
	t, err := time.Parse(time.RFC3339Nano, at.Value)
	if err != nil {
		return o, fmt.Errorf("order %s: created_at: %w", id.Value, err)
	}
	return order{ID: id.Value, Item: item.Value, Amount: n, CreatedAt: t.UTC()}, nil
}

// writeOrder answers with o; a 201 has its Location.
func writeOrder(w http.ResponseWriter, status int, o order) {
	body, _ := json.Marshal(o) // cannot fail
	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusCreated {
		w.Header().Set("Location", "/orders/"+o.ID)
	}
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

// errService is the Kind of the service's own problems.
var errService = errors.New("order service")

// fail answers with an RFC 9457 problem, written as idem writes its own.
func fail(w http.ResponseWriter, r *http.Request, status int, detail string, retryAfter time.Duration) {
	idem.WriteProblem(w, r, &idem.Error{Kind: errService, Status: status, Title: http.StatusText(status), Detail: detail, RetryAfter: retryAfter})
}
