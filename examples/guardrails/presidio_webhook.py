"""Microsoft Presidio as the filter's `webhook` guardrail service.

    python presidio_webhook.py [--port 8000] [--entities EMAIL_ADDRESS,...]

Serves the webhook contract (docs/guardrails.md): `POST /check` with
`{"api": ..., "texts": [...]}` is answered `{"flagged": bool, "texts": [...]}`,
each text with what Presidio's analyzer found replaced by its anonymizer
(`<EMAIL_ADDRESS>`, `<CREDIT_CARD>`, ...). Only Presidio's pattern
recognizers run (regular expressions with checksums and context words): no
spaCy model is loaded or downloaded, so names and addresses, which need one,
are not found. On start it prints `{"port": N}` on one line.
"""

import argparse
import json
import sys
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

try:
    import tldextract
    from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
    from presidio_analyzer.nlp_engine import NlpArtifacts, NlpEngine
    from presidio_analyzer.predefined_recognizers.generic import email_recognizer
    from presidio_anonymizer import AnonymizerEngine
except ImportError as e:
    print(f"presidio-analyzer and presidio-anonymizer are not installed: {e}", file=sys.stderr)
    sys.exit(3)

ENTITIES = "EMAIL_ADDRESS,PHONE_NUMBER,CREDIT_CARD,IBAN_CODE,US_SSN,IP_ADDRESS"
# Most bytes of texts one check reads.
MAX_BODY = 1 << 20

# The e-mail recognizer checks top-level domains against the public suffix
# list: the copy tldextract ships, never fetched.
email_recognizer.tldextract = types.SimpleNamespace(
    extract=tldextract.TLDExtract(suffix_list_urls=())
)


class NoModel(NlpEngine):
    """An NLP engine that loads nothing: the pattern recognizers need no
    tokens (without them, context words do not raise a score)."""

    def load(self):
        pass

    def is_loaded(self):
        return True

    def process_text(self, text, language):
        return NlpArtifacts(
            entities=[], tokens=[], tokens_indices=[], lemmas=[], nlp_engine=self, language=language
        )

    def process_batch(self, texts, language, batch_size=1, n_process=1, **kwargs):
        for text in texts:
            yield text, self.process_text(text, language)

    def is_stopword(self, word, language):
        return False

    def is_punct(self, word, language):
        return False

    def get_supported_entities(self):
        return []

    def get_supported_languages(self):
        return ["en"]


def engines():
    registry = RecognizerRegistry()
    registry.load_predefined_recognizers(languages=["en"])
    # The one recognizer that needs a model's entities.
    registry.remove_recognizer("SpacyRecognizer")
    analyzer = AnalyzerEngine(registry=registry, nlp_engine=NoModel(), supported_languages=["en"])
    return analyzer, AnonymizerEngine()


def check(analyzer, anonymizer, entities, texts):
    masked, flagged = [], False
    for text in texts:
        found = analyzer.analyze(text=text, language="en", entities=entities)
        flagged |= bool(found)
        masked.append(anonymizer.anonymize(text=text, analyzer_results=found).text if found else text)
    return {"flagged": flagged, "texts": masked} if flagged else {"flagged": False}


def handler(analyzer, anonymizer, entities):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            if self.path != "/check":
                return self.answer(404, {"error": "no such path"})
            length = int(self.headers.get("content-length") or 0)
            if length > MAX_BODY:
                return self.answer(413, {"error": "too long"})
            try:
                texts = json.loads(self.rfile.read(length))["texts"]
                if not all(isinstance(t, str) for t in texts):
                    raise ValueError
            except (ValueError, KeyError, TypeError):
                return self.answer(400, {"error": "`texts` (strings) is required"})
            self.answer(200, check(analyzer, anonymizer, entities, texts))

        def answer(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            # The texts are the prompts: never logged.
            pass

    return Handler


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--entities", default=ENTITIES)
    args = p.parse_args()
    analyzer, anonymizer = engines()
    entities = args.entities.split(",")
    server = ThreadingHTTPServer((args.host, args.port), handler(analyzer, anonymizer, entities))
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
