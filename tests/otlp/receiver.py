#!/usr/bin/env python3
"""An OTLP/HTTP trace receiver for the end-to-end tests: every POST to
/v1/traces is decoded with the official opentelemetry-proto definitions
(ExportTraceServiceRequest, protobuf), and each span is appended to a JSON
lines file, its ids in hex; a body that does not decode is answered 400 and
recorded as such. Prints its port once listening.

    receiver.py <out.jsonl> [--delay-s S] [--status N]
"""

import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--delay-s", type=float, default=0.0)
    ap.add_argument("--status", type=int, default=200)
    args = ap.parse_args()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.body()
            record = {"path": self.path, "content_type": self.headers.get("content-type")}
            try:
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                spans = []
                for rs in req.resource_spans:
                    resource = {kv.key: value(kv.value) for kv in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            spans.append({
                                "resource": resource,
                                "scope": ss.scope.name,
                                "trace_id": s.trace_id.hex(),
                                "span_id": s.span_id.hex(),
                                "parent_span_id": s.parent_span_id.hex(),
                                "name": s.name,
                                "kind": s.kind,
                                "start": s.start_time_unix_nano,
                                "end": s.end_time_unix_nano,
                                "flags": s.flags,
                                "status": MessageToDict(s.status),
                                "attributes": {kv.key: value(kv.value) for kv in s.attributes},
                            })
                record["spans"] = spans
                status = args.status
            except Exception as e:  # a body the official decoder refuses
                record["error"] = str(e)
                status = 400
            with open(args.out, "a") as f:
                f.write(json.dumps(record) + "\n")
            if args.delay_s:
                time.sleep(args.delay_s)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(status)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def body(self):
            """The request's body, sized or chunked (Envoy's own OTLP
            exporter sends its exports chunked)."""
            if "chunked" not in self.headers.get("transfer-encoding", "").lower():
                return self.rfile.read(int(self.headers.get("content-length", "0")))
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
