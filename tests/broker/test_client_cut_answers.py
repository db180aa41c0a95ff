"""An answer cut short (a broker killed while sending it) is a lost connection to the
client: a read, which repeats safely, goes on with the next try; a produce, which the
broker may have applied, is not sent again. aiohttp raises ``ClientPayloadError`` for it,
not a connection error, and the client once let it escape a read (seen in
``test_moves_and_a_sigkilled_owner_under_live_producers_and_consumers``)."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from tiered.broker.client import BrokerClient

_READ_ANSWER = json.dumps({"messages": [], "next": 0, "moved": False, "epoch": 1}).encode()


class _CuttingServer:
    """Answers the first ``cut`` requests with headers promising a body and then closes
    the connection; later ones whole. Counts requests by method."""

    def __init__(self, cut: int) -> None:
        self.cut = cut
        self.requests: list[str] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method = head.split(b" ", 1)[0].decode()
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        if length:
            await reader.readexactly(length)
        self.requests.append(method)
        if len(self.requests) <= self.cut:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 496\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(_READ_ANSWER), _READ_ANSWER))
        await writer.drain()
        writer.close()


async def _against(server: _CuttingServer, scenario):
    listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    try:
        async with BrokerClient([f"http://127.0.0.1:{port}"], timeout_s=30, backoff_s=0.001) as client:
            return await scenario(client)
    finally:
        listening.close()
        await listening.wait_closed()


def test_a_read_whose_answer_was_cut_short_is_tried_again() -> None:
    server = _CuttingServer(cut=2)
    batch = asyncio.run(_against(server, lambda client: client.read("/ns/t", 0, wait_s=0)))
    assert batch.messages == [] and batch.next_offset == 0
    assert server.requests == ["GET", "GET", "GET"]


def test_a_produce_whose_answer_was_cut_short_is_not_sent_again() -> None:
    server = _CuttingServer(cut=5)
    with pytest.raises(aiohttp.ClientPayloadError):
        asyncio.run(_against(server, lambda client: client.produce("/ns/t", [b"m"])))
    assert server.requests == ["POST"], "a produce the broker may have applied was sent again"
