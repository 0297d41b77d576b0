"""Checks AWS SigV4 signatures as the provider does, with AWS's own signer.

Reads one JSON object on stdin:

    {"access_key": ..., "secret_key": ..., "region": ..., "service": ...,
     "requests": [{"method": "POST", "path": "/p?q=1",
                   "headers": [["name", "value"], ...], "body_b64": "..."}]}

each request exactly as the mock provider received it, and prints one JSON
object: {"sdk_version": <botocore's>, "results": [...]}, a result per
request saying whether its `authorization` is the one botocore's
`SigV4Auth` computes over those bytes (`valid`), and why not.

Like AWS, it takes the request's own `x-amz-date` and the headers its
`SignedHeaders` names, and hashes the body it received: a body changed
after signing fails, as does a signed header changed on the way.
"""

import base64
import datetime
import hashlib
import json
import re
import sys
from unittest import mock

import botocore
import botocore.auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

AUTH = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<credential>[^,\s]+),\s*"
    r"SignedHeaders=(?P<signed>[^,\s]+),\s*Signature=(?P<signature>[0-9a-f]+)$"
)


def verify(creds, region, service, req):
    headers = [(k.lower(), v) for k, v in req["headers"]]
    body = base64.b64decode(req["body_b64"])
    received = next((v for k, v in headers if k == "authorization"), None)
    if received is None:
        return {"valid": False, "reason": "no authorization header"}
    m = AUTH.match(received)
    if m is None:
        return {"valid": False, "reason": "not a SigV4 authorization", "received": received}
    amz_date = next((v for k, v in headers if k == "x-amz-date"), None)
    if amz_date is None:
        return {"valid": False, "reason": "no x-amz-date"}
    signed = m.group("signed").split(";")
    host = next((v for k, v in headers if k == "host"), "")
    request = AWSRequest(
        method=req["method"],
        url=f"https://{host}{req['path']}",
        data=body,
    )
    for k, v in headers:
        if k in signed:
            # Appends: a repeated header keeps every value, in order.
            request.headers[k] = v
    auth = botocore.auth.SigV4Auth(creds, service, region)
    # AWS hashes the body it received: the signed `x-amz-content-sha256`
    # must be that hash (botocore would otherwise take the header's word).
    body_hash = auth.payload(request)
    declared = request.headers.get("X-Amz-Content-SHA256")
    if declared is not None:
        del request.headers["X-Amz-Content-SHA256"]
        request.headers["X-Amz-Content-SHA256"] = body_hash
    at = datetime.datetime.strptime(amz_date, botocore.auth.SIGV4_TIMESTAMP)
    # The server signs at the request's own time; the blacklist is what
    # botocore chooses not to sign as a client, while a server checks the
    # headers the client declared it signed.
    with mock.patch.object(botocore.auth, "get_current_datetime", return_value=at), \
            mock.patch.object(botocore.auth, "SIGNED_HEADERS_BLACKLIST", []):
        auth.add_auth(request)
    expected = request.headers["Authorization"]
    result = {"valid": expected == received, "signed_headers": signed}
    if declared is not None and declared != body_hash:
        result["reason"] = "x-amz-content-sha256 is not the hash of the body received"
    elif expected != received:
        result["reason"] = "signature mismatch"
    if expected != received:
        result["expected"] = expected
        result["received"] = received
    return result


def main():
    spec = json.load(sys.stdin)
    creds = Credentials(spec["access_key"], spec["secret_key"])
    results = [
        verify(creds, spec["region"], spec["service"], r) for r in spec["requests"]
    ]
    print(json.dumps({"sdk_version": botocore.__version__, "results": results}))


if __name__ == "__main__":
    main()
