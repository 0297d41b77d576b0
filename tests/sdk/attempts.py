"""What both SDK scripts record of a call: every HTTP attempt the SDK makes."""

import time


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

    def hooks(self):
        """The event hooks of an httpx client that records the attempts."""
        return {"request": [self.on_request], "response": [self.on_response]}
