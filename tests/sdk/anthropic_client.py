"""The official Anthropic Python SDK as a client of Envoy with llm-filter.

One subcommand per scenario of the end-to-end tests (tests/tests/e2e/
sdk_dialects.rs), which start the mock upstream and Envoy, run this with
--base-url pointing at Envoy (without /v1: the SDK adds /v1/messages), and
assert on the one JSON object printed on stdout (and on what the mock
received). The SDK adds `anthropic-version`. The key (sk-ant-e2e-sdk) goes in
`x-api-key`, as the API documents it and Claude Code sends it: the SDK itself
(2.x) sends its api_key as `Authorization: Bearer`, which --auth bearer keeps.
The SDK has no `temperature` parameter, so none is sent. Every object carries
`sdk_version`. What each scenario prints:

  messages    messages.create: {id, model, text, stop_reason,
              usage: {input, output, cache_read, cache_creation}}
  messages_stream
              the client.messages.stream(...) helper: {events: [type, ...] in
              the order the helper yields them (the raw events but `ping`, which
              the SDK drops, each text delta followed by its `text` event, and
              `content_block_stop` as the helper reports it), text (the `text`
              events joined), final_text, id, stop_reason, usage (of the final
              message: message_start's input with message_delta's output),
              at_ms (each event's arrival, from the call), first_event_ms,
              last_event_ms}
  messages_stream_error
              the stream helper: {text (the `text` events joined), error_class and
              message of what the SDK raised, when it did}
  messages_raw
              messages.with_raw_response.create, --calls times:
              {calls: [{status, x_cache, age, request_id, headers: {x-*,
              retry-after, request-id}, id, text, elapsed_ms (the call's,
              as the SDK's caller waited for it)}]}
  messages_calls
              messages.create, --calls times, each answer or error kept:
              {calls: [{status, error_class (null on success), type
              (error.type of an error body), headers: {anthropic-ratelimit-*,
              retry-after, x-should-retry}}]}
  messages_error
              one messages.create expected to fail: {error_class (e.g.
              OverloadedError, RateLimitError, InternalServerError,
              ServiceUnavailableError, APITimeoutError, APIStatusError; null
              when the call succeeded), status, type (error.type of the body),
              message, request_id, elapsed_ms, attempts: [{sent_ms, status,
              retry_after, should_retry}] as the HTTP client's event hooks saw
              every attempt, the SDK's retries included}

  conversations
              --conversations conversations of --turns turns each, the
              SDK's answer kept in the history, each starting with its own
              question under --system (with --client-marker, a system block
              the client marks with cache_control itself; with --tool-words
              N, a tool whose description is N words): {turns: [{usage,
              conversation, turn}], error (the first refusal: {status,
              message}, null when none)}

--header NAME:VALUE (repeatable) adds a header to every call (e.g.
x-request-priority: P2, cache-control: max-age=60, the mock's x-mock-* knobs);
--max-retries sets the SDK's retries (default 0).
"""

import argparse
import json
import sys
import time

import anthropic

from attempts import Attempts

KEY = "sk-ant-e2e-sdk"


def client(args, attempts=None):
    http = None
    if attempts is not None:
        http = anthropic.DefaultHttpxClient(
            event_hooks=attempts.hooks()
        )
    headers = {}
    if args.auth == "x-api-key":
        headers = {"x-api-key": args.api_key, "Authorization": anthropic.omit}
    return anthropic.Anthropic(
        base_url=args.base_url,
        api_key=args.api_key,
        default_headers=headers,
        max_retries=args.max_retries,
        timeout=args.timeout,
        http_client=http,
    )


def extra_headers(args):
    headers = {}
    for h in args.header:
        name, _, value = h.partition(":")
        headers[name.strip()] = value.strip()
    return headers


def create_args(args):
    """The keyword arguments of a messages.create the options ask for."""
    kwargs = {
        "model": args.model,
        "max_tokens": args.max_tokens,
        "messages": [{"role": "user", "content": args.prompt}],
        "extra_headers": extra_headers(args),
    }
    if args.system is not None:
        kwargs["system"] = args.system
    if args.user_id is not None:
        kwargs["metadata"] = {"user_id": args.user_id}
    return kwargs


def usage(u):
    if u is None:
        return None
    return {
        "input": u.input_tokens,
        "output": u.output_tokens,
        "cache_read": u.cache_read_input_tokens,
        "cache_creation": u.cache_creation_input_tokens,
    }


def text(message):
    return "".join(block.text for block in message.content if block.type == "text")


def messages(args):
    m = client(args).messages.create(**create_args(args))
    return {
        "id": m.id,
        "model": m.model,
        "text": text(m),
        "stop_reason": m.stop_reason,
        "usage": usage(m.usage),
    }


def warm_stream_types():
    """Builds the SDK's parser of stream events once before the call, so its
    first build (long on a busy machine) is not the first event's time."""
    from anthropic._models import construct_type
    from anthropic.types import RawMessageStreamEvent

    construct_type(type_=RawMessageStreamEvent, value={"type": "message_stop"})


def messages_stream(args):
    warm_stream_types()
    c = client(args)
    started = time.monotonic()
    events, at, deltas = [], [], []
    with c.messages.stream(**create_args(args)) as s:
        for event in s:
            at.append(round((time.monotonic() - started) * 1000))
            events.append(event.type)
            if event.type == "text":
                deltas.append(event.text)
        final = s.get_final_message()
        final_text = s.get_final_text()
    return {
        "events": events,
        "text": "".join(deltas),
        "final_text": final_text,
        "id": final.id,
        "stop_reason": final.stop_reason,
        "usage": usage(final.usage),
        "at_ms": at,
        "first_event_ms": at[0] if at else None,
        "last_event_ms": at[-1] if at else None,
    }


def messages_stream_error(args):
    """A stream the filter may end with an error event: the text the SDK
    yielded before, and what it raised."""
    text, out = [], {"error_class": None}
    try:
        with client(args).messages.stream(**create_args(args)) as s:
            for event in s:
                if event.type == "text":
                    text.append(event.text)
    except anthropic.APIError as e:
        out = {"error_class": type(e).__name__, "message": str(e)}
    out["text"] = "".join(text)
    return out


def messages_raw(args):
    c = client(args)
    calls = []
    for _ in range(args.calls):
        started = time.monotonic()
        raw = c.messages.with_raw_response.create(**create_args(args))
        parsed = raw.parse()
        elapsed_ms = round((time.monotonic() - started) * 1000, 2)
        calls.append(
            {
                "status": raw.status_code,
                "x_cache": raw.headers.get("x-cache"),
                "age": raw.headers.get("age"),
                "request_id": raw.headers.get("request-id"),
                "headers": {
                    k: v
                    for k, v in raw.headers.items()
                    if k.startswith("x-") or k in ("retry-after", "age", "request-id")
                },
                "id": parsed.id,
                "text": text(parsed),
                "elapsed_ms": elapsed_ms,
            }
        )
    return {"calls": calls}


def told(headers):
    return {
        k: v
        for k, v in headers.items()
        if k.startswith("anthropic-ratelimit-") or k in ("retry-after", "x-should-retry")
    }


def messages_calls(args):
    c = client(args)
    calls = []
    for _ in range(args.calls):
        try:
            raw = c.messages.with_raw_response.create(**create_args(args))
            raw.parse()
            calls.append({"status": raw.status_code, "error_class": None, "type": None, "headers": told(raw.headers)})
        except anthropic.APIStatusError as e:
            calls.append(
                {
                    "status": e.status_code,
                    "error_class": type(e).__name__,
                    "type": e.type,
                    "headers": told(e.response.headers),
                }
            )
    return {"calls": calls}


def messages_error(args):
    attempts = Attempts()
    c = client(args, attempts)
    started = time.monotonic()
    try:
        c.messages.create(**create_args(args))
    except anthropic.AnthropicError as e:
        out = {"error_class": type(e).__name__, "elapsed_ms": round((time.monotonic() - started) * 1000)}
        if isinstance(e, anthropic.APIStatusError):
            out.update(status=e.status_code, type=e.type, message=e.api_message, request_id=e.request_id)
        out["attempts"] = attempts.list
        return out
    return {"error_class": None, "attempts": attempts.list}


def conversations(args):
    c = client(args)
    system = args.system
    if args.client_marker:
        system = [{"type": "text", "text": args.system, "cache_control": {"type": "ephemeral"}}]
    out = {"turns": [], "error": None}
    for n in range(args.conversations):
        said = []
        for turn in range(args.turns):
            said.append({"role": "user", "content": f"conversation {n} question {turn}: {args.prompt}"})
            kwargs = create_args(args)
            kwargs["messages"] = said
            if system is not None:
                kwargs["system"] = system
            if args.tool_words:
                kwargs["tools"] = [
                    {
                        "name": "lookup",
                        "description": "Looks the platform's records up. " * (args.tool_words // 5),
                        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
                    }
                ]
            try:
                m = c.messages.create(**kwargs)
            except anthropic.APIStatusError as e:
                out["error"] = {"status": e.status_code, "message": e.message}
                return out
            said.append({"role": "assistant", "content": text(m)})
            out["turns"].append({"conversation": n, "turn": turn, "usage": usage(m.usage)})
    return out


SCENARIOS = {
    "conversations": conversations,
    "messages": messages,
    "messages_stream": messages_stream,
    "messages_stream_error": messages_stream_error,
    "messages_raw": messages_raw,
    "messages_error": messages_error,
    "messages_calls": messages_calls,
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--base-url", required=True, help="Envoy's listener, without /v1")
    p.add_argument("--model", default="claude-sonnet-4-5")
    p.add_argument("--prompt", default="hello from the SDK")
    p.add_argument("--system", help="the call's system prompt")
    p.add_argument("--user-id", help="metadata.user_id")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument(
        "--auth", choices=["x-api-key", "bearer"], default="x-api-key", help="where the key goes (default x-api-key)"
    )
    p.add_argument("--api-key", default=KEY, help="the key the SDK sends")
    p.add_argument("--max-retries", type=int, default=0)
    p.add_argument("--timeout", type=float, default=30.0, help="the SDK's own timeout, s")
    p.add_argument("--calls", type=int, default=1, help="calls of messages_raw and messages_calls")
    p.add_argument("--header", action="append", default=[], metavar="NAME:VALUE", help="a header of every call")
    p.add_argument("--conversations", type=int, default=1, help="conversations of the conversations scenario")
    p.add_argument("--turns", type=int, default=1, help="turns of each conversation")
    p.add_argument("--client-marker", action="store_true", help="the client marks its system prompt")
    p.add_argument("--tool-words", type=int, default=0, help="words of the conversations' one tool's description")
    args = p.parse_args()
    out = SCENARIOS[args.scenario](args)
    out["sdk_version"] = anthropic.__version__
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
