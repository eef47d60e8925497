# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A plain-HTTP door on loopback to a server that speaks only mutual TLS (roles/vllm_server with
vllm_server_tls_clients), for clients that cannot present a client certificate (`vllm bench serve`):

  python3 tls_forward.py --listen 127.0.0.1:18000 --to 127.0.0.1:8000 --tls-dir /etc/onprem-vllm/tls

Each connection to --listen is one TLS connection to --to, pinned to the server's certificate (server.crt) and
presenting the host's local identity (local.crt, local.key); bytes are passed through as they are. Loopback only, run
as root on the server's host (the identity is root's). Standard library only.
"""
from __future__ import annotations

import argparse
import asyncio
import ssl


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", required=True, help="127.0.0.1:PORT (loopback only)")
    parser.add_argument("--to", required=True, help="the TLS server, HOST:PORT")
    parser.add_argument("--tls-dir", required=True, help="server.crt, local.crt and local.key")
    args = parser.parse_args()
    listen_host, listen_port = args.listen.rsplit(":", 1)
    if listen_host not in ("127.0.0.1", "::1", "localhost"):
        parser.error("--listen must be a loopback address")
    to_host, to_port = args.to.rsplit(":", 1)
    context = ssl.create_default_context(cafile=args.tls_dir + "/server.crt")
    context.load_cert_chain(args.tls_dir + "/local.crt", args.tls_dir + "/local.key")

    async def forward(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection(to_host, int(to_port), ssl=context)
        except (ConnectionError, OSError, ssl.SSLError):
            client_writer.close()
            return
        await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))

    async def serve():
        server = await asyncio.start_server(forward, listen_host, int(listen_port))
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
