"""Messages between the judge and the candidate's process: length-prefixed JSON over a Unix
socket, with file descriptors (the arenas' handles) passed alongside when needed."""
from __future__ import annotations

import json
import select
import socket
import struct
import time


class ChannelClosed(Exception):
    pass


class Channel:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._buffer = b""
        self._fds: list[int] = []

    def send(self, message: dict, fds: tuple[int, ...] = ()) -> None:
        body = json.dumps(message).encode()
        frame = struct.pack("!I", len(body)) + body
        if fds:
            socket.send_fds(self.sock, [frame], list(fds))
        else:
            self.sock.sendall(frame)

    def readable(self, timeout: float) -> bool:
        """Whether a message has (begun to) come within `timeout` seconds, reading nothing."""
        return bool(self._buffer) or bool(select.select([self.sock], [], [], max(timeout, 0.0))[0])

    def receive(self, timeout: float | None = None) -> tuple[dict, list[int]] | None:
        """The next message and the fds that came with it; None on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if len(self._buffer) >= 4:
                size = struct.unpack("!I", self._buffer[:4])[0]
                if len(self._buffer) >= 4 + size:
                    body, self._buffer = self._buffer[4:4 + size], self._buffer[4 + size:]
                    fds, self._fds = self._fds, []
                    return json.loads(body), fds
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.sock.settimeout(left)
            else:
                self.sock.settimeout(None)
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 16, 8)
            except socket.timeout:
                return None
            except OSError as error:
                raise ChannelClosed(str(error)) from None
            if not data:
                raise ChannelClosed("the other side closed the channel")
            self._buffer += data
            self._fds += fds
