"""The demo upstream behind Envoy and nginx (scripts/demo, docker-compose.yml): answers every GET
or POST with 200 and one line of text, on 127.0.0.1:8000 (the address examples/ forward to)."""

import http.server


class Hello(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        body = b"hello from the upstream\n"
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", 8000), Hello).serve_forever()
