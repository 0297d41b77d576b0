"""The official OpenAI Python SDK as a client of Envoy with llm-filter.

One subcommand per scenario of tests/tests/e2e/sdk.rs, which starts the mock
upstream and Envoy, runs this with --base-url pointing at Envoy, and asserts
on the one JSON object printed on stdout (and on what the mock received).
"""

import argparse
import json
import sys
import time

import openai

KEY = "sk-e2e-sdk"


class Attempts:
    """Every HTTP attempt the SDK makes (its retries included), as its HTTP
    client's event hooks see them: when it was sent, what came back."""

    def __init__(self):
        self.started = time.monotonic()
        self.list = []

    def ms(self):
        return round((time.monotonic() - self.started) * 1000)

    def on_request(self, request):
        self.list.append({"sent_ms": self.ms()})

    def on_response(self, response):
        if self.list:
            self.list[-1].update(
                status=response.status_code,
                retry_after=response.headers.get("retry-after"),
                should_retry=response.headers.get("x-should-retry"),
            )


def client(args, attempts=None, **kwargs):
    http = None
    if attempts is not None:
        http = openai.DefaultHttpxClient(
            event_hooks={"request": [attempts.on_request], "response": [attempts.on_response]}
        )
    return openai.OpenAI(
        base_url=args.base_url,
        api_key=KEY,
        max_retries=args.max_retries,
        timeout=args.timeout,
        http_client=http,
        **kwargs,
    )


def usage(u):
    if u is None:
        return None
    return {"prompt": u.prompt_tokens, "completion": getattr(u, "completion_tokens", None), "total": u.total_tokens}


def messages(text):
    return [{"role": "user", "content": text}]


def chat(args):
    r = client(args).chat.completions.create(model=args.model, messages=messages(args.prompt))
    return {
        "id": r.id,
        "model": r.model,
        "content": r.choices[0].message.content,
        "finish_reason": r.choices[0].finish_reason,
        "usage": usage(r.usage),
    }


def stream(args):
    started = time.monotonic()
    s = client(args).chat.completions.create(
        model=args.model,
        messages=messages(args.prompt),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = []
    for chunk in s:
        delta = chunk.choices[0].delta.content if chunk.choices else None
        chunks.append(
            {
                "at_ms": round((time.monotonic() - started) * 1000),
                "content": delta,
                "finish_reason": chunk.choices[0].finish_reason if chunk.choices else None,
                "usage": usage(chunk.usage),
            }
        )
    return {"chunks": chunks, "content": "".join(c["content"] or "" for c in chunks)}


def embeddings(args):
    inputs = ["the first text", "a second one", "and a third"]
    r = client(args).embeddings.create(model=args.model, input=inputs)
    return {
        "count": len(r.data),
        "indexes": [d.index for d in r.data],
        "dimensions": [len(d.embedding) for d in r.data],
        "usage": usage(r.usage),
    }


def cache(args):
    c = client(args)
    calls = []
    for _ in range(2):
        raw = c.chat.completions.with_raw_response.create(
            model=args.model, messages=messages(args.prompt), temperature=0
        )
        parsed = raw.parse()
        calls.append(
            {
                "status": raw.status_code,
                "x_cache": raw.headers.get("x-cache"),
                "age": raw.headers.get("age"),
                "content": parsed.choices[0].message.content,
                "id": parsed.id,
            }
        )
    return {"calls": calls}


def error(e, attempts, started):
    out = {"error_class": type(e).__name__, "elapsed_ms": round((time.monotonic() - started) * 1000)}
    if isinstance(e, openai.APIStatusError):
        out.update(status=e.status_code, code=e.code, type=e.type, message=e.message)
    if attempts is not None:
        out["attempts"] = attempts.list
    return out


def refused(args, extra_headers):
    """One chat call the filter refuses; what the SDK raised and every attempt."""
    attempts = Attempts()
    started = time.monotonic()
    try:
        client(args, attempts).chat.completions.create(
            model=args.model, messages=messages(args.prompt), extra_headers=extra_headers
        )
    except openai.OpenAIError as e:
        return error(e, attempts, started)
    return {"error_class": None, "attempts": attempts.list}


def shed(args):
    return refused(args, {"x-request-priority": "P2"})


def budget(args):
    return refused(args, {"x-request-timeout-ms": str(args.budget_ms)})


SCENARIOS = {
    "chat": chat,
    "stream": stream,
    "embeddings": embeddings,
    "cache": cache,
    "shed": shed,
    "budget": budget,
}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--base-url", required=True, help="Envoy's listener, with /v1")
    p.add_argument("--model", default="gpt-4o-mini")
    p.add_argument("--prompt", default="hello from the SDK")
    p.add_argument("--max-retries", type=int, default=0)
    p.add_argument("--timeout", type=float, default=30.0, help="the SDK's own timeout, s")
    p.add_argument("--budget-ms", type=int, default=500, help="x-request-timeout-ms")
    args = p.parse_args()
    out = SCENARIOS[args.scenario](args)
    out["sdk_version"] = openai.__version__
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
