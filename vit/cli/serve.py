"""Serve a trained model over HTTP, on LitServe (Lightning's serving engine):

    python -m vit.cli.serve --checkpoint CKPT [--preset NAME] [--runtime torch|onnx] [--host 127.0.0.1] [--port 8000]
        [--max-batch-size 32] [--batch-timeout 0.01] [--workers 1] [--top-k 5] [--max-image-bytes 20000000]

`POST /predict` takes one image: the raw request body (Content-Type image/... or application/octet-stream), a
multipart form field `image`, or JSON {"image": "<base64>"}. It answers {"predictions": [{"class": NAME,
"probability": P}, ...]}, what `python -m vit.cli.predict` lists for the image: the image read the same way, scored as
evaluation scored it (the run's test-time views), the top-k classes, or, for a multi-label model, every class at or
above its threshold. Requests that arrive within --batch-timeout seconds of each other are scored as one batch of up
to --max-batch-size. Each image is decoded once as it arrives: one that cannot be read is answered 400, one past
--max-image-bytes 413, each with one line ({"detail": ...}), and the requests beside it are served. `GET /health`
answers "ok". The server listens on loopback unless --host says otherwise; SIGTERM stops it and its worker
processes. With --runtime onnx each worker scores in ONNX Runtime: --checkpoint may be a .onnx export
(vit/cli/runtime.py).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import io
import json
import signal
import sys
from typing import Any

import litserve as ls
import torch
from fastapi import HTTPException
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send
from torch import Tensor

from vit.cli.checkpoint_args import add_checkpoint_arguments
from vit.cli.predict import positive, ranked, read_image, require_classifier
from vit.cli.runtime import add_runtime_argument, load_model, read_model

IMAGE = "image"  # the form field and JSON key that carry the image
MAX_IMAGE_BYTES = 20_000_000


def image_bytes(payload: dict[str, Any]) -> bytes:
    """The image of a JSON request {"image": base64}; ValueError in one line for anything else."""
    if not isinstance(payload, dict) or not isinstance(payload.get(IMAGE), str):
        raise ValueError(
            f'the request holds no image: send its bytes, a form field "{IMAGE}", or JSON {{"{IMAGE}": base64}}'
        )
    try:
        return base64.b64decode(payload[IMAGE], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f'"{IMAGE}" is not base64') from None


class ImageRequests:
    """ASGI middleware in front of LitServe's /predict: every way of sending an image becomes JSON {"image": base64}
    of the original bytes, after the image was decoded once here (a bad or oversized one is answered here, alone,
    instead of failing the batch it would have joined in the worker)."""

    def __init__(self, app: ASGIApp, path: str = "/predict", max_bytes: int = MAX_IMAGE_BYTES):
        self.app, self.path, self.max_bytes = app, path, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        request, kind, length = Request(scope, receive), headers.get("content-type", ""), headers.get("content-length")
        try:
            if length is not None and length.isdigit() and int(length) > 2 * self.max_bytes + 65536:  # base64, forms
                raise HTTPException(
                    413, f"the request is {int(length):,} bytes, past --max-image-bytes {self.max_bytes:,}"
                )
            data = await self._image(request, kind)
            if len(data) > self.max_bytes:
                raise HTTPException(413, f"the image is {len(data):,} bytes, past --max-image-bytes {self.max_bytes:,}")
            read_image(io.BytesIO(data), name="the image")
        except HTTPException as err:
            await self._answer(send, err.status_code, err.detail)
            return
        except ValueError as err:
            await self._answer(send, 400, str(err).splitlines()[0])
            return
        body = json.dumps({IMAGE: base64.b64encode(data).decode()}).encode()
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-type", b"content-length")]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        sent = False

        async def replayed() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return await receive()  # the client's disconnect, if it comes
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app({**scope, "headers": headers}, replayed, send)

    async def _image(self, request: Request, kind: str) -> bytes:
        if kind.startswith("multipart/form-data"):
            form = await request.form(max_part_size=self.max_bytes + 1)
            field = form.get(IMAGE)
            if field is None or isinstance(field, str):
                raise ValueError(f'the form has no file field "{IMAGE}"')
            return await field.read()
        if kind.startswith("application/json"):
            try:
                return image_bytes(json.loads(await request.body()))
            except json.JSONDecodeError:
                raise ValueError("the request body is not JSON") from None
        return await request.body()  # image/..., application/octet-stream, or no type: the bytes are the image

    @staticmethod
    async def _answer(send: Send, status: int, detail: str) -> None:
        body = json.dumps({"detail": detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class ImageClassifier(ls.LitAPI):
    """The model of a checkpoint behind LitServe: an image per request in, its ranked classes out."""

    def __init__(self, args: argparse.Namespace):
        super().__init__(max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout)
        self.args = args

    def setup(self, device: str) -> None:
        torch.set_num_threads(max(1, torch.get_num_threads() // self.args.workers))  # ONNX Runtime's too
        model = load_model(self.args)
        self.loaded, self.logits = model.loaded, model.logits

    def decode_request(self, request) -> Tensor:  # unannotated: LitServe then hands over the parsed JSON
        image = read_image(io.BytesIO(image_bytes(request)), name="the image")  # checked by ImageRequests already
        return self.loaded.preprocess(image)[0]  # (C, H, W), as predict reads a file

    def batch(self, inputs: list[Tensor]) -> list[Tensor]:
        return inputs  # stacked in predict where they share a size (images at their own size may not)

    @torch.inference_mode()
    def predict(self, images: Tensor | list[Tensor]) -> Any:
        if isinstance(images, Tensor):  # --max-batch-size 1: one image
            return ranked(self.loaded, self.logits(images[None])[0], self.args.top_k)
        if len({x.shape for x in images}) == 1:
            rows = self.logits(torch.stack(images))
        else:
            rows = [self.logits(x[None])[0] for x in images]
        return [ranked(self.loaded, row, self.args.top_k) for row in rows]

    def unbatch(self, output: list[Any]) -> list[Any]:
        return output

    def encode_response(self, output: list[tuple[str, float]]) -> dict[str, Any]:
        return {"predictions": [{"class": name, "probability": p} for name, p in output]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vit.cli.serve", description=__doc__.split("\n\n")[0])
    add_checkpoint_arguments(parser)
    add_runtime_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-batch-size", type=positive, default=32, help="images scored together at most (32)")
    parser.add_argument("--batch-timeout", type=float, default=0.01, help="seconds a batch waits to fill (0.01)")
    parser.add_argument("--workers", type=positive, default=1, help="model processes, each with the model (1)")
    parser.add_argument("--top-k", type=positive, default=5, help="classes to list (a multi-label model: its tags)")
    parser.add_argument("--max-image-bytes", type=positive, default=MAX_IMAGE_BYTES, help="larger images get 413")
    args = parser.parse_args(argv)
    if args.batch_timeout < 0:
        parser.error(f"--batch-timeout {args.batch_timeout}: seconds, >= 0")
    try:  # in this process first: a bad file is one line here, not a traceback in a worker
        require_classifier(read_model(args))
    except ValueError as err:
        raise SystemExit(f"error: {str(err).splitlines()[0]}") from None
    server = ls.LitServer(
        ImageClassifier(args),
        accelerator="cpu" if not torch.cuda.is_available() else "auto",
        workers_per_device=args.workers,
        middlewares=[(ImageRequests, {"max_bytes": args.max_image_bytes})],
    )
    signal.signal(signal.SIGTERM, _interrupt)  # LitServe stops its server and worker processes on KeyboardInterrupt
    server.run(host=args.host, port=args.port, generate_client_file=False)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
