# A service in another language that knows nothing of idem: every POST
# places an order.
import http.server, itertools, json

orders = itertools.count(1)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        out = json.dumps({"order": next(orders), "request": body.decode()}).encode() + b"\n"
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

http.server.ThreadingHTTPServer(("", 9000), Handler).serve_forever()
