"""A real S3 server and a fault-injecting proxy for the remote suites, as processes on 127.0.0.1.

:class:`S3Server` runs moto's standalone S3 server (``moto[server]``) and :class:`FaultProxy`
the proxy of ``tests/s3_processes.py`` in front of it; the clients under test reach either over
TCP through their own HTTP stack, as they would reach a real store (nothing in the client is
mocked). ``tests/conftest.py`` makes them session fixtures, skipped when moto is not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).with_name("s3_processes.py")
#: Seconds a server process may take to say it listens (moto imports for a second or two).
START_SECONDS = 60.0


class ServerProcess:
    """A process of ``s3_processes.py``: started, its ports read, stopped with its pipes."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(SCRIPT), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        line = self._first_line()
        self.ports: dict[str, int] = json.loads(line)

    def _first_line(self) -> bytes:
        # A thread-free wait: poll the pipe until the line comes or the time is up.
        import selectors

        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(START_SECONDS):
                self.stop()
                raise RuntimeError(f"{SCRIPT.name} did not start in {START_SECONDS} s")
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            raise RuntimeError(f"{SCRIPT.name} exited with {code} before listening")
        return line

    def stop(self) -> None:
        """Close its standard input (it exits), then make sure."""
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()


class S3Server:
    """moto's S3 server on a free port of 127.0.0.1; buckets and objects are made with boto3."""

    def __init__(self) -> None:
        self._process = ServerProcess("s3")
        self.port = self._process.ports["port"]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        import boto3

        self.client = boto3.client("s3", **client_arguments(self.endpoint))

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """What an S3 client reads from its environment to reach this server (through
        ``endpoint``, e.g. a proxy's, when given): endpoint, credentials, region, plain HTTP."""
        return client_environment(endpoint or self.endpoint)

    def create_bucket(self, prefix: str = "tokstream") -> str:
        """A new empty bucket with a unique name: each test gets its own."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=name)
        return name

    def put(self, bucket: str, key: str, data: bytes | Path) -> None:
        body = data.read_bytes() if isinstance(data, Path) else data
        self.client.put_object(Bucket=bucket, Key=key, Body=body)

    def upload(self, directory: Path, bucket: str, prefix: str = "") -> list[str]:
        """Every file under ``directory`` to ``s3://bucket/prefix/...`` with the same relative
        names (a tokenize directory, a Megatron pair, shards); the keys in sorted order."""
        keys = []
        for path in sorted(p for p in Path(directory).rglob("*") if p.is_file()):
            key = "/".join(
                filter(None, [prefix.strip("/"), path.relative_to(directory).as_posix()])
            )
            self.put(bucket, key, path)
            keys.append(key)
        return keys

    def stop(self) -> None:
        self._process.stop()


class FaultProxy:
    """The delaying, fault-injecting proxy in front of ``upstream`` (see ``s3_processes.py``)."""

    def __init__(self, upstream: S3Server) -> None:
        self._process = ServerProcess("proxy", str(upstream.port))
        self.endpoint = f"http://127.0.0.1:{self._process.ports['port']}"
        self._control = f"http://127.0.0.1:{self._process.ports['control']}"
        self.upstream = upstream

    def env(self) -> dict[str, str]:
        """The client environment that sends every request through this proxy."""
        return self.upstream.env(self.endpoint)

    def configure(self, delay_ms: float = 0, rules: list[dict[str, Any]] | None = None) -> None:
        """Replace the delay and the fault rules (and clear the request log)."""
        body = json.dumps({"delay_ms": delay_ms, "rules": rules or []}).encode()
        request = urllib.request.Request(f"{self._control}/config", data=body, method="PUT")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def stats(self) -> dict[str, Any]:
        """``{"open": client connections open now, "requests": [...]}`` (oldest first)."""
        with urllib.request.urlopen(f"{self._control}/stats", timeout=10) as response:
            return json.loads(response.read())

    def ports(self) -> set[int]:
        """The client ports of the connections open now."""
        return set(self.stats()["ports"])

    def wait_until_no_connection(self, besides: set[int] = frozenset(), seconds: float = 10.0):
        """Poll until no client connection is open but those of ``besides`` (ports, e.g. of an
        earlier test's pooled clients) or ``seconds`` pass; the others' ports, sorted."""
        end = time.monotonic() + seconds
        while (others := self.ports() - besides) and time.monotonic() < end:
            time.sleep(0.05)
        return sorted(others)

    def stop(self) -> None:
        self._process.stop()


def client_environment(endpoint: str) -> dict[str, str]:
    """The standard AWS variables for ``endpoint``: read by obstore, fsspec/s3fs and boto3 alike."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def client_arguments(endpoint: str) -> dict[str, str]:
    return {
        "endpoint_url": endpoint,
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "region_name": "us-east-1",
    }


class Bucket:
    """A test's own bucket, and the environment its client reads (straight or through a proxy)."""

    def __init__(self, server: S3Server, proxy: FaultProxy | None = None) -> None:
        self.server = server
        self.proxy = proxy
        self.name = server.create_bucket()
        self.env = proxy.env() if proxy else server.env()

    def url(self, key: str = "") -> str:
        return f"s3://{self.name}/{key}"

    def put(self, key: str, data: bytes | Path) -> str:
        """One object; its URL."""
        self.server.put(self.name, key, data)
        return self.url(key)

    def upload(self, directory: Path, prefix: str = "") -> list[str]:
        """Every file under ``directory`` below ``prefix``; their URLs in sorted order."""
        return [self.url(key) for key in self.server.upload(directory, self.name, prefix)]
