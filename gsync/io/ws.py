"""Opening a websocket the way every gsync connection does.

websocket-client validates UTF-8 in pure Python on every frame (about 70 ms for a 120 kB
NIP-77 message); skipping that is safe because ``recv`` still decodes text frames strictly
and every message then goes through the protocol parser.
"""
import websocket


def connect(url: str, timeout: float, **options) -> websocket.WebSocket:
    return websocket.create_connection(
        url, timeout=timeout, enable_multithread=False, skip_utf8_validation=True, **options
    )
