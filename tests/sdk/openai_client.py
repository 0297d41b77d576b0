"""The official OpenAI Python SDK as a client of Envoy with llm-filter.

One subcommand per scenario of the end-to-end tests (tests/tests/e2e/sdk.rs
for chat, sdk_dialects.rs for the Responses API), which start the mock
upstream and Envoy, run this with --base-url pointing at Envoy (with /v1), and
assert on the one JSON object printed on stdout (and on what the mock
received). Every object carries `sdk_version`. What each scenario prints:

  chat_raw    chat.completions.with_raw_response.create, --calls times:
              {calls: [{status, headers: {x-*, retry-after}, id, content}]}
  chat        {id, model, content, finish_reason, usage: {prompt, completion, total,
              cached, reasoning}} (cached: prompt_tokens_details.cached_tokens,
              reasoning: completion_tokens_details.reasoning_tokens, null when absent)
  stream      {chunks: [{at_ms, content, finish_reason, usage}], content}
  stream_error
              a chat stream: {content (the text yielded), error_class, message, code
              of what the SDK raised, when it did}
  embeddings  {count, indexes, dimensions, usage}
  cache       {calls: [{status, x_cache, age, content, id}] x2}  (temperature 0)
  shed, budget, chat_error (a chat call with --header and --api-key)
              {error_class, elapsed_ms, status, code, type, message,
               attempts: [{sent_ms, status, retry_after, should_retry}]}
              (error_class null when the call succeeded)

  responses   responses.create: {id, model, status, output_text,
              usage: {input, output, cached, total}}
  responses_stream
              responses.create(stream=True): {events: [type, ...] in order,
              sequence_numbers, text (the output_text deltas joined), id,
              output_text (of response.completed), usage (of response.completed),
              at_ms (each event's arrival, from the call), first_event_ms,
              last_event_ms}
  responses_raw
              responses.with_raw_response.create, --calls times:
              {calls: [{status, x_cache, age, headers: {x-*, retry-after},
              id, output_text}]}
  responses_chain
              two calls, the second with previous_response_id = the first's id:
              {calls: [{status, id, previous_response_id, x_mock_instance,
              output_text}] x2}
  responses_shed
              responses.create refused (x-request-priority: P2 unless --priority
              says otherwise), like shed: {error_class, status, code, type,
              message, attempts, elapsed_ms}

--api-key KEY sets the key the SDK sends ('' sends none: a keyless app).
--azure-api-version V makes the client Azure OpenAI's (openai.AzureOpenAI,
--base-url its endpoint without /v1, the model its deployment): it calls
/openai/deployments/<model>/chat/completions?api-version=V with the key in
`api-key`.
--temperature T sets the chat scenarios' temperature (chat, chat_raw, and the
refused calls of shed, budget and chat_error); without it they send none.
--header NAME:VALUE (repeatable) adds a header to the chat and Responses
scenarios' calls (e.g. cache-control: max-age=60, the mock's x-mock-* knobs,
or `host` for a proxy that routes by it).
"""

import argparse
import json
import sys
import time

import openai

from attempts import Attempts

KEY = "sk-e2e-sdk"


def client(args, attempts=None, **kwargs):
    http = None
    if attempts is not None:
        http = openai.DefaultHttpxClient(
            event_hooks=attempts.hooks()
        )
    if not args.api_key:
        # A keyless app: the SDK insists on a key, so it gets one it never
        # sends (its Authorization header is taken off each request).
        hooks = attempts.hooks() if attempts is not None else {}
        hooks.setdefault("request", []).append(keyless)
        http = openai.DefaultHttpxClient(event_hooks=hooks)
    if args.azure_api_version:
        return openai.AzureOpenAI(
            azure_endpoint=args.base_url,
            api_version=args.azure_api_version,
            api_key=args.api_key or "unused",
            max_retries=args.max_retries,
            timeout=args.timeout,
            http_client=http,
            **kwargs,
        )
    return openai.OpenAI(
        base_url=args.base_url,
        api_key=args.api_key or "unused",
        max_retries=args.max_retries,
        timeout=args.timeout,
        http_client=http,
        **kwargs,
    )


def keyless(request):
    """Takes the key the SDK insists on off the request (OpenAI's
    Authorization, Azure's api-key)."""
    request.headers.pop("authorization", None)
    request.headers.pop("api-key", None)


def detail(u, details, name):
    d = getattr(u, details, None)
    return getattr(d, name, None) if d is not None else None


def usage(u):
    if u is None:
        return None
    return {
        "prompt": u.prompt_tokens,
        "completion": getattr(u, "completion_tokens", None),
        "total": u.total_tokens,
        "cached": detail(u, "prompt_tokens_details", "cached_tokens"),
        "reasoning": detail(u, "completion_tokens_details", "reasoning_tokens"),
    }


def sampling(args):
    """The chat call's sampling parameters the options set."""
    return {} if args.temperature is None else {"temperature": args.temperature}


def messages(text):
    return [{"role": "user", "content": text}]


def chat(args):
    said = messages(args.prompt)
    for n in range(args.turns):
        said += [{"role": "assistant", "content": f"answer {n}"}, {"role": "user", "content": f"and then {n}?"}]
    r = client(args).chat.completions.create(
        model=args.model, messages=said, extra_headers=extra_headers(args), **sampling(args)
    )
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


def stream_error(args):
    """A chat stream the filter may end with an error event: the text the SDK
    yielded before, and what it raised."""
    s = client(args).chat.completions.create(
        model=args.model, messages=messages(args.prompt), stream=True, extra_headers=extra_headers(args)
    )
    text, out = [], {"error_class": None}
    try:
        for chunk in s:
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
    except openai.APIError as e:
        out = {"error_class": type(e).__name__, "message": e.message, "code": getattr(e, "code", None)}
    out["content"] = "".join(text)
    return out


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
            model=args.model, messages=messages(args.prompt), extra_headers=extra_headers, **sampling(args)
        )
    except openai.OpenAIError as e:
        return error(e, attempts, started)
    return {"error_class": None, "attempts": attempts.list}


def extra_headers(args, **more):
    """The --header values, and `more` where they do not set it."""
    headers = dict(more)
    for h in args.header:
        name, _, value = h.partition(":")
        headers[name.strip()] = value.strip()
    return headers


def interesting_headers(headers):
    """The response headers a test asserts on: the filter's and the mock's
    `x-*`, `retry-after`, `age`."""
    return {k: v for k, v in headers.items() if k.startswith("x-") or k in ("retry-after", "age")}


def responses_usage(u):
    if u is None:
        return None
    details = getattr(u, "input_tokens_details", None)
    return {
        "input": u.input_tokens,
        "output": u.output_tokens,
        "cached": getattr(details, "cached_tokens", None),
        "total": u.total_tokens,
    }


def responses_args(args):
    """The keyword arguments of a responses.create the options ask for."""
    kwargs = {"model": args.model, "input": args.prompt, "extra_headers": extra_headers(args)}
    if args.instructions is not None:
        kwargs["instructions"] = args.instructions
    if args.max_output_tokens is not None:
        kwargs["max_output_tokens"] = args.max_output_tokens
    if args.previous_response_id is not None:
        kwargs["previous_response_id"] = args.previous_response_id
    return kwargs


def responses(args):
    r = client(args).responses.create(**responses_args(args))
    return {
        "id": r.id,
        "model": r.model,
        "status": r.status,
        "output_text": r.output_text,
        "usage": responses_usage(r.usage),
    }


def warm_stream_types():
    """Builds the SDK's parser of Responses events once before the call: the
    first build takes long (most of a second on a busy machine), which would
    otherwise land on the first event's time and bunch the events behind it."""
    from openai._models import construct_type
    from openai.types.responses import ResponseStreamEvent

    construct_type(type_=ResponseStreamEvent, value={"type": "response.output_text.delta", "delta": ""})


def responses_stream(args):
    warm_stream_types()
    c = client(args)
    started = time.monotonic()
    s = c.responses.create(stream=True, **responses_args(args))
    out = {"events": [], "sequence_numbers": [], "text": "", "id": None, "output_text": None, "usage": None}
    at = []
    for event in s:
        at.append(round((time.monotonic() - started) * 1000))
        out["events"].append(event.type)
        out["sequence_numbers"].append(getattr(event, "sequence_number", None))
        if event.type == "response.output_text.delta":
            out["text"] += event.delta
        elif event.type == "response.completed":
            out["id"] = event.response.id
            out["output_text"] = event.response.output_text
            out["usage"] = responses_usage(event.response.usage)
    out["at_ms"] = at
    out["first_event_ms"] = at[0] if at else None
    out["last_event_ms"] = at[-1] if at else None
    return out


def raw_call(c, kwargs):
    raw = c.responses.with_raw_response.create(**kwargs)
    parsed = raw.parse()
    return {
        "status": raw.status_code,
        "x_cache": raw.headers.get("x-cache"),
        "age": raw.headers.get("age"),
        "headers": interesting_headers(raw.headers),
        "id": parsed.id,
        "previous_response_id": parsed.previous_response_id,
        "output_text": parsed.output_text,
    }


def chat_raw(args):
    """chat.completions.with_raw_response.create, --calls times."""
    c = client(args)
    calls = []
    for _ in range(args.calls):
        raw = c.chat.completions.with_raw_response.create(
            model=args.model, messages=messages(args.prompt), extra_headers=extra_headers(args), **sampling(args)
        )
        parsed = raw.parse()
        calls.append(
            {
                "status": raw.status_code,
                "headers": interesting_headers(raw.headers),
                "id": parsed.id,
                "content": parsed.choices[0].message.content,
            }
        )
    return {"calls": calls}


def responses_raw(args):
    c = client(args)
    return {"calls": [raw_call(c, responses_args(args)) for _ in range(args.calls)]}


def responses_chain(args):
    c = client(args)
    first = raw_call(c, responses_args(args))
    second = raw_call(c, dict(responses_args(args), previous_response_id=first["id"]))
    calls = [first, second]
    for call in calls:
        call["x_mock_instance"] = call["headers"].get("x-mock-instance")
    return {"calls": calls}


def responses_shed(args):
    """One Responses call the filter refuses; what the SDK raised and every attempt."""
    attempts = Attempts()
    started = time.monotonic()
    kwargs = responses_args(args)
    kwargs["extra_headers"] = extra_headers(args, **{"x-request-priority": args.priority or "P2"})
    try:
        client(args, attempts).responses.create(**kwargs)
    except openai.OpenAIError as e:
        return error(e, attempts, started)
    return {"error_class": None, "attempts": attempts.list}


def shed(args):
    return refused(args, {"x-request-priority": "P2"})


def budget(args):
    return refused(args, {"x-request-timeout-ms": str(args.budget_ms)})


def chat_error(args):
    return refused(args, extra_headers(args))


SCENARIOS = {
    "chat": chat,
    "chat_raw": chat_raw,
    "stream": stream,
    "stream_error": stream_error,
    "embeddings": embeddings,
    "cache": cache,
    "shed": shed,
    "budget": budget,
    "chat_error": chat_error,
    "responses": responses,
    "responses_stream": responses_stream,
    "responses_raw": responses_raw,
    "responses_chain": responses_chain,
    "responses_shed": responses_shed,
}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--base-url", required=True, help="Envoy's listener, with /v1")
    p.add_argument("--model", default="gpt-4o-mini")
    p.add_argument("--api-key", default=KEY, help="the key the SDK sends ('' for none)")
    p.add_argument("--prompt", default="hello from the SDK")
    p.add_argument("--max-retries", type=int, default=0)
    p.add_argument("--temperature", type=float, help="the chat scenarios' temperature (none sent without it)")
    p.add_argument("--timeout", type=float, default=30.0, help="the SDK's own timeout, s")
    p.add_argument("--budget-ms", type=int, default=500, help="x-request-timeout-ms")
    p.add_argument("--header", action="append", default=[], metavar="NAME:VALUE", help="a header of the chat and Responses calls")
    p.add_argument("--instructions", help="the Responses call's instructions")
    p.add_argument("--max-output-tokens", type=int)
    p.add_argument("--previous-response-id")
    p.add_argument("--priority", help="x-request-priority of responses_shed (default P2)")
    p.add_argument("--calls", type=int, default=1, help="calls of responses_raw")
    p.add_argument("--turns", type=int, default=0, help="earlier turns of chat's conversation after --prompt")
    p.add_argument("--azure-api-version", help="an Azure OpenAI client of this API version")
    args = p.parse_args()
    out = SCENARIOS[args.scenario](args)
    out["sdk_version"] = openai.__version__
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
