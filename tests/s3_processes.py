"""The two server processes the remote suites talk to, each run as its own process on 127.0.0.1.

``python tests/s3_processes.py s3``
    moto's S3 server (a real HTTP server speaking the S3 protocol, objects held in its memory).
``python tests/s3_processes.py proxy UPSTREAM_PORT``
    a fault-injecting HTTP proxy in front of it: every request waits ``delay_ms`` before it is
    forwarded (the round trip of a distant store), and rules chosen by the test answer matching
    requests with an error status, drop the connection, truncate the response body or stall
    past the client's deadline. A second port takes the rules and reports what was served.

Each prints one JSON line with its ports once it accepts connections, and exits when its
standard input closes (so a test run killed outright leaves no server behind) or on SIGTERM.
Bounded: the proxy serves only the loopback clients of the test that started it, and keeps the
last ``LOG_LIMIT`` requests. ``tests/object_store.py`` starts, steers and stops both.

The proxy's control port speaks JSON over HTTP:

``PUT /config``  ``{"delay_ms": 30, "rules": [RULE, ...]}`` replaces the configuration and
    clears the log. A RULE is ``{"action": ACTION, "method": "GET", "path": "part/of/key",
    "ranged": true, "skip": 0, "times": 1, "ms": 5000, "status": 503}``, every key but
    ``action`` optional: the first rule a request matches (method, a substring of its target,
    whether it has a Range header) acts on it, after letting ``skip`` matches pass, at most
    ``times`` times (unbounded without it). ACTION is ``"status"`` (answer ``status`` with an S3
    error body, the connection kept), ``"drop"`` (close the connection unanswered), ``"truncate"``
    (forward, then send the headers and half the body, and close), ``"stall"`` (answer nothing
    for ``ms`` milliseconds, then close) or ``"delay"`` (``ms`` more before forwarding).
``GET /stats``  ``{"open": N, "ports": [...], "requests": [{"method", "target", "range",
    "action", "status", "body_bytes"}, ...]}``: the client connections open now (and their
    client ports) and the requests served (in the order they finished).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import threading

#: Requests the proxy's log keeps (the oldest are forgotten first).
LOG_LIMIT = 100_000
HOST = "127.0.0.1"
#: The largest request or response head the proxy reads.
HEAD_LIMIT = 1 << 16


def exit_with_stdin() -> None:
    """End this process when the parent closes our standard input (or dies)."""

    def wait() -> None:
        sys.stdin.buffer.read()
        os._exit(0)

    threading.Thread(target=wait, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))


def announce(**ports: int) -> None:
    sys.stdout.write(json.dumps(ports) + "\n")
    sys.stdout.flush()


# ---- moto's S3 server ----------------------------------------------------------------------


def serve_s3() -> None:
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address=HOST, port=0, verbose=False)
    server.start()
    exit_with_stdin()
    announce(port=server.get_host_and_port()[1])
    threading.Event().wait()


# ---- the fault-injecting proxy ---------------------------------------------------------------


class Message:
    """One HTTP/1.1 request or response as read off a socket: its head and its raw body."""

    def __init__(self, head: bytes, body: bytes, close: bool) -> None:
        self.head = head
        self.body = body
        #: The sender closes the connection after this message.
        self.close = close

    @property
    def first_line(self) -> str:
        return self.head.split(b"\r\n", 1)[0].decode("latin-1")

    def header(self, name: str) -> str | None:
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.decode("latin-1").partition(":")
            if key.strip().lower() == name:
                return value.strip()
        return None


async def read_message(reader: asyncio.StreamReader, bodiless: bool = False) -> Message | None:
    """The next message on ``reader``, None at a clean end of stream. ``bodiless``: a response
    to HEAD, whose Content-Length describes a body that is not sent."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as error:
        if error.partial:
            raise ConnectionError("the stream ended inside a message head") from None
        return None
    message = Message(head, b"", False)
    connection = (message.header("connection") or "").lower()
    status = message.first_line.split(" ")[1] if message.first_line.startswith("HTTP/") else ""
    message.close = connection == "close" or message.first_line.endswith("HTTP/1.0")
    length = message.header("content-length")
    if bodiless or status in ("204", "304") or status.startswith("1"):
        return message
    if (message.header("transfer-encoding") or "").lower() == "chunked":
        chunks = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            chunks.append(size_line + await reader.readexactly(size + 2))
            if size == 0:
                break
        message.body = b"".join(chunks)
    elif length is not None:
        message.body = await reader.readexactly(int(length))
    elif message.first_line.startswith("HTTP/"):
        message.body = await reader.read()  # a response delimited by the end of the stream
        message.close = True
    return message


def keep_alive_head(response: Message) -> bytes:
    """The response's head for the client: without the server's ``Connection`` (the proxy keeps
    the client's connection open as long as the client does), with the body's length stated."""
    lines = response.head[:-4].split(b"\r\n")
    kept = [line for line in lines if not line.lower().startswith((b"connection:", b"keep-alive:"))]
    framed = response.header("content-length") is not None or response.header("transfer-encoding")
    if not framed:
        kept.append(f"Content-Length: {len(response.body)}".encode())
    return b"\r\n".join(kept) + b"\r\n\r\n"


def error_response(status: int) -> bytes:
    reasons = {403: "Forbidden", 500: "Internal Server Error", 503: "Service Unavailable"}
    codes = {403: "AccessDenied", 500: "InternalError", 503: "SlowDown"}
    code, reason = codes.get(status, "InternalError"), reasons.get(status, "Error")
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>injected by the test proxy</Message></Error>"
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


class Proxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.delay_ms = 0.0
        self.rules: list[dict] = []
        self.matched: list[int] = []
        self.log: list[dict] = []
        #: The client port of each connection open now.
        self.open: set[int] = set()

    def configure(self, config: dict) -> None:
        self.delay_ms = float(config.get("delay_ms", 0))
        self.rules = list(config.get("rules", []))
        self.matched = [0] * len(self.rules)
        self.log.clear()

    def rule_for(self, request: Message) -> dict | None:
        method, target = request.first_line.split(" ")[:2]
        ranged = request.header("range") is not None
        for i, rule in enumerate(self.rules):
            if rule.get("method", method) != method or rule.get("path", "") not in target:
                continue
            if rule.get("ranged", ranged) != ranged:
                continue
            self.matched[i] += 1
            skip = rule.get("skip", 0)
            if self.matched[i] <= skip:
                return None
            times = rule.get("times")
            if times is not None and self.matched[i] > skip + times:
                continue
            return rule
        return None

    def record(self, request: Message, action: str, status: str, body_bytes: int) -> None:
        method, target = request.first_line.split(" ")[:2]
        entry = {"method": method, "target": target, "range": request.header("range")}
        entry.update(action=action, status=status, body_bytes=body_bytes)
        self.log.append(entry)
        if len(self.log) > LOG_LIMIT:
            del self.log[: len(self.log) - LOG_LIMIT]

    async def serve_client(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter):
        port = client_w.get_extra_info("peername")[1]
        self.open.add(port)
        try:
            while True:
                request = await read_message(client_r)
                if request is None:
                    return
                rule = self.rule_for(request)
                action = rule["action"] if rule else "forward"
                if action == "status":
                    client_w.write(error_response(int(rule["status"])))
                    await client_w.drain()
                    self.record(request, action, str(rule["status"]), 0)
                    continue
                if action == "drop":
                    self.record(request, action, "", 0)
                    return
                if action == "stall":
                    self.record(request, action, "", 0)
                    # Until the client gives up (closes) or the stall ends.
                    timeout = float(rule.get("ms", 60_000)) / 1000
                    try:
                        await asyncio.wait_for(client_r.read(), timeout)
                    except asyncio.TimeoutError:
                        pass
                    return
                delay = self.delay_ms + (float(rule.get("ms", 0)) if action == "delay" else 0)
                if delay:
                    await asyncio.sleep(delay / 1000)
                response = await self.forward(request)
                status = response.first_line.split(" ")[1]
                head = keep_alive_head(response)
                if action == "truncate":
                    sent = response.body[: len(response.body) // 2]
                    client_w.write(head + sent)
                    await client_w.drain()
                    self.record(request, action, status, len(sent))
                    return
                client_w.write(head + response.body)
                await client_w.drain()
                self.record(request, action, status, len(response.body))
                if request.close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return
        finally:
            self.open.discard(port)
            client_w.close()

    async def forward(self, request: Message) -> Message:
        """The server's response to ``request``, over a connection of its own (moto's server
        closes every connection after one response; the client's stays open)."""
        reader, writer = await asyncio.open_connection(HOST, self.upstream_port)
        try:
            writer.write(request.head + request.body)
            await writer.drain()
            method = request.first_line.split(" ")[0]
            response = await read_message(reader, bodiless=method == "HEAD")
            if response is None:
                raise ConnectionError("the server closed the connection unanswered")
            return response
        finally:
            writer.close()

    async def serve_control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            request = await read_message(reader)
            if request is None:
                return
            method, target = request.first_line.split(" ")[:2]
            if (method, target) == ("PUT", "/config"):
                self.configure(json.loads(request.body or b"{}"))
                body = b"{}"
            elif (method, target) == ("GET", "/stats"):
                stats = {"open": len(self.open), "ports": sorted(self.open), "requests": self.log}
                body = json.dumps(stats).encode()
            else:
                body = json.dumps({"error": f"no such control: {method} {target}"}).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        finally:
            writer.close()


async def run_proxy(upstream_port: int) -> None:
    proxy = Proxy(upstream_port)
    data = await asyncio.start_server(proxy.serve_client, HOST, 0, limit=HEAD_LIMIT)
    control = await asyncio.start_server(proxy.serve_control, HOST, 0, limit=HEAD_LIMIT)
    exit_with_stdin()
    announce(port=data.sockets[0].getsockname()[1], control=control.sockets[0].getsockname()[1])
    await asyncio.Event().wait()


if __name__ == "__main__":
    if sys.argv[1:] == ["s3"]:
        serve_s3()
    elif len(sys.argv) == 3 and sys.argv[1] == "proxy":
        asyncio.run(run_proxy(int(sys.argv[2])))
    else:
        sys.exit("usage: s3_processes.py s3 | proxy UPSTREAM_PORT")
