"""The official Google Gen AI Python SDK (google-genai) as a Gemini API client
of Envoy with llm-filter.

One subcommand per scenario of the end-to-end tests (tests/tests/e2e/
gemini.rs), which start the mock upstream and Envoy, run this with --base-url
pointing at Envoy (without the version: the SDK adds /v1beta/models/{model}:
generateContent, or :streamGenerateContent?alt=sse), and assert on the one
JSON object printed on stdout (and on what the mock received). The key
(gemini-e2e-sdk) goes in `x-goog-api-key`, as the SDK sends an API key; the
SDK adds `x-goog-api-client`. The SDK retries nothing unless --max-retries
asks (then it retries 408, 429, 500, 502, 503 and 504 with exponential
backoff, never reading `retry-after`). Every object carries `sdk_version`.
What each scenario prints:

  generate    models.generate_content: {text, model_version, response_id,
              finish_reason, usage: {prompt, candidates, total, cached,
              thoughts}, headers: {x-*, age, retry-after} of the answer}
  generate_stream
              models.generate_content_stream: {chunks (the responses the SDK
              yielded), texts (each one's text), text (joined), finish_reason
              (the last one's), response_id, usage (the last one's), at_ms
              (each chunk's arrival, from the call), first_event_ms,
              last_event_ms}
  generate_calls
              models.generate_content, --calls times, each answer or error
              kept: {calls: [{status, error_class (null on success),
              status_name (error.status of an error body), x_cache, age,
              headers: {x-*, age, retry-after}, response_id, text}]}
  generate_error
              one models.generate_content expected to fail: {error_class
              (ClientError, ServerError, APIError; a transport error's class;
              null when the call succeeded), code (error.code, the HTTP
              status), status_name (error.status, e.g. RESOURCE_EXHAUSTED),
              message, elapsed_ms, attempts: [{sent_ms, status, retry_after,
              should_retry}] as the HTTP client's event hooks saw every
              attempt, the SDK's retries included}

--header NAME:VALUE (repeatable) adds a header to every call (e.g.
x-request-priority: P2, cache-control: max-age=60, the mock's x-mock-* knobs).
"""

import argparse
import json
import sys
import time

from google import genai
from google.genai import errors, types

from attempts import Attempts

KEY = "gemini-e2e-sdk"


def headers_of(args):
    headers = {}
    for h in args.header:
        name, _, value = h.partition(":")
        headers[name.strip()] = value.strip()
    return headers


def client(args, attempts=None):
    client_args = {}
    if attempts is not None:
        client_args["event_hooks"] = attempts.hooks()
    retry = None
    if args.max_retries > 0:
        retry = types.HttpRetryOptions(attempts=args.max_retries + 1)
    return genai.Client(
        api_key=args.api_key,
        http_options=types.HttpOptions(
            base_url=args.base_url,
            api_version=args.api_version,
            headers=headers_of(args),
            timeout=None if args.timeout is None else round(args.timeout * 1000),
            client_args=client_args,
            retry_options=retry,
        ),
    )


def config(args):
    """The call's GenerateContentConfig, from the options."""
    kwargs = {}
    if args.system is not None:
        kwargs["system_instruction"] = args.system
    if args.temperature is not None:
        kwargs["temperature"] = args.temperature
    if args.max_output_tokens is not None:
        kwargs["max_output_tokens"] = args.max_output_tokens
    return types.GenerateContentConfig(**kwargs) if kwargs else None


def contents(args):
    """The turns: --turn ROLE:TEXT ones (in order), then the prompt's."""
    turns = []
    for t in args.turn:
        role, _, text = t.partition(":")
        turns.append(types.Content(role=role.strip(), parts=[types.Part(text=text)]))
    turns.append(types.Content(role="user", parts=[types.Part(text=args.prompt)]))
    return turns


def call_args(args):
    return {"model": args.model, "contents": contents(args), "config": config(args)}


def usage(u):
    if u is None:
        return None
    return {
        "prompt": u.prompt_token_count,
        "candidates": u.candidates_token_count,
        "total": u.total_token_count,
        "cached": u.cached_content_token_count,
        "thoughts": u.thoughts_token_count,
    }


def told(headers):
    return {
        k: v
        for k, v in (headers or {}).items()
        if k.lower().startswith("x-") or k.lower() in ("retry-after", "age")
    }


def finish_reason(response):
    candidates = response.candidates or []
    reason = candidates[0].finish_reason if candidates else None
    return reason.value if reason is not None else None


def response_headers(response):
    http = response.sdk_http_response
    return http.headers if http is not None else {}


def generate(args):
    # The client closes its HTTP client when collected: keep it for the call.
    c = client(args)
    r = c.models.generate_content(**call_args(args))
    return {
        "text": r.text,
        "model_version": r.model_version,
        "response_id": r.response_id,
        "finish_reason": finish_reason(r),
        "usage": usage(r.usage_metadata),
        "headers": told(response_headers(r)),
    }


def generate_stream(args):
    c = client(args)
    started = time.monotonic()
    texts, at, last = [], [], None
    for chunk in c.models.generate_content_stream(**call_args(args)):
        at.append(round((time.monotonic() - started) * 1000))
        texts.append(chunk.text)
        last = chunk
    return {
        "chunks": len(texts),
        "texts": texts,
        "text": "".join(t or "" for t in texts),
        "finish_reason": finish_reason(last) if last else None,
        "response_id": last.response_id if last else None,
        "usage": usage(last.usage_metadata) if last else None,
        "at_ms": at,
        "first_event_ms": at[0] if at else None,
        "last_event_ms": at[-1] if at else None,
    }


def generate_calls(args):
    c = client(args)
    calls = []
    for _ in range(args.calls):
        try:
            r = c.models.generate_content(**call_args(args))
            headers = response_headers(r)
            lower = {k.lower(): v for k, v in (headers or {}).items()}
            calls.append(
                {
                    "status": 200,
                    "error_class": None,
                    "status_name": None,
                    "x_cache": lower.get("x-cache"),
                    "age": lower.get("age"),
                    "headers": told(headers),
                    "response_id": r.response_id,
                    "text": r.text,
                }
            )
        except errors.APIError as e:
            headers = e.response.headers if e.response is not None else {}
            calls.append(
                {
                    "status": e.code,
                    "error_class": type(e).__name__,
                    "status_name": e.status,
                    "x_cache": headers.get("x-cache"),
                    "age": headers.get("age"),
                    "headers": told(headers),
                    "response_id": None,
                    "text": None,
                }
            )
    return {"calls": calls}


def generate_error(args):
    attempts = Attempts()
    c = client(args, attempts)
    started = time.monotonic()
    try:
        c.models.generate_content(**call_args(args))
    except Exception as e:  # the SDK's errors and the transport's
        out = {"error_class": type(e).__name__, "elapsed_ms": round((time.monotonic() - started) * 1000)}
        if isinstance(e, errors.APIError):
            out.update(code=e.code, status_name=e.status, message=e.message)
        out["attempts"] = attempts.list
        return out
    return {"error_class": None, "attempts": attempts.list}


SCENARIOS = {
    "generate": generate,
    "generate_stream": generate_stream,
    "generate_calls": generate_calls,
    "generate_error": generate_error,
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--base-url", required=True, help="Envoy's listener, without the version")
    p.add_argument("--api-version", default="v1beta")
    p.add_argument("--model", default="gemini-2.5-flash")
    p.add_argument("--prompt", default="hello from the SDK")
    p.add_argument("--turn", action="append", default=[], metavar="ROLE:TEXT", help="an earlier turn (user or model)")
    p.add_argument("--system", help="the call's system instruction")
    p.add_argument("--temperature", type=float)
    p.add_argument("--max-output-tokens", type=int)
    p.add_argument("--api-key", default=KEY, help="the key the SDK sends in x-goog-api-key")
    p.add_argument("--max-retries", type=int, default=0, help="the SDK's retries (default none)")
    p.add_argument("--timeout", type=float, help="the SDK's own timeout, s (sent as x-server-timeout)")
    p.add_argument("--calls", type=int, default=1, help="calls of generate_calls")
    p.add_argument("--header", action="append", default=[], metavar="NAME:VALUE", help="a header of every call")
    args = p.parse_args()
    out = SCENARIOS[args.scenario](args)
    out["sdk_version"] = genai.__version__
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
