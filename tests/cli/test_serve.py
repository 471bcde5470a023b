"""python -m vit.cli.serve on loopback: a server process of a small trained run answers as predict does, alone or
32 clients at once, in every way of sending an image; a bad or oversized image gets one line and the server goes
on; SIGTERM stops it."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from tests.helpers import tiny_run
from vit.checkpoint import load
from vit.cli.predict import predict
from vit.training.run import train

pytest.importorskip("litserve")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _post(url: str, body: bytes, kind: str) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": kind}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _png(seed: int, size: tuple[int, int] = (20, 24)) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def _multipart(data: bytes) -> tuple[bytes, str]:
    boundary = "vit-boundary"
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="x.png"\r\n'
            "Content-Type: image/png\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()  # fmt: skip
    return body, f"multipart/form-data; boundary={boundary}"


def _send(url: str, data: bytes, way: str) -> tuple[int, dict]:
    if way == "raw":
        return _post(url, data, "image/png")
    if way == "form":
        return _post(url, *_multipart(data))
    return _post(url, json.dumps({"image": base64.b64encode(data).decode()}).encode(), "application/json")


def _start(checkpoint: str, *options: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "vit.cli.serve", "--checkpoint", checkpoint, "--port", str(port), *options],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server stopped: {process.stdout.read()[-3000:]}")
        try:
            if _get(f"{url}/health") == (200, b"ok"):
                return process, url
        except OSError:
            pass
        time.sleep(0.5)
    process.kill()
    raise AssertionError("the server did not answer /health within 120 s")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return train(tiny_run(tmp_path_factory.mktemp("run"), "trainer.max_epochs=1"))["best_checkpoint"]


@pytest.fixture(scope="module")
def server(checkpoint):
    process, url = _start(checkpoint, "--max-batch-size", "8", "--batch-timeout", "0.05", "--max-image-bytes", "20000")
    yield url
    process.send_signal(signal.SIGTERM)  # kill() would leave LitServe's server and worker processes behind
    process.wait(timeout=60)


def _as_predict_answers(loaded, data: bytes) -> list[tuple[str, float]]:
    return predict(loaded, Image.open(io.BytesIO(data)), top_k=5)


@pytest.mark.slow  # a server process: ~12 s to start, shared by the module's slow tests
def test_32_clients_at_once_are_answered_as_predict_answers_each_image(server, checkpoint):
    loaded = load(checkpoint)
    images = [_png(seed, (16 + seed % 5, 16 + seed % 3)) for seed in range(32)]
    ways = ["raw", "form", "json"]
    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda k: _send(f"{server}/predict", images[k], ways[k % 3]), range(32)))
    for data, (status, body) in zip(images, answers, strict=True):
        assert status == 200, body
        expected = _as_predict_answers(loaded, data)
        assert [p["class"] for p in body["predictions"]] == [name for name, _ in expected]
        np.testing.assert_allclose([p["probability"] for p in body["predictions"]], [p for _, p in expected], atol=1e-5)


@pytest.mark.parametrize(
    ("body", "kind", "status", "said"),
    [
        (b"not an image", "image/png", 400, r"^the image: not a readable image: cannot identify image file$"),
        (b'{"x": 1}', "application/json", 400, r"^the request holds no image: send its bytes"),
        (b'{"image": "%%%"}', "application/json", 400, r'^"image" is not base64$'),
        (b"{", "application/json", 400, r"^the request body is not JSON$"),
        (_png(0, (100, 100)), "image/png", 413, r"^the image is [\d,]+ bytes, past --max-image-bytes 20,000$"),
        (bytes(200_000), "image/png", 413, r"^the request is 200,000 bytes, past --max-image-bytes 20,000$"),
    ],
)
@pytest.mark.slow  # the module's server
def test_a_bad_request_gets_one_line_and_the_next_good_one_is_answered(server, body, kind, status, said):
    import re

    got, answer = _post(f"{server}/predict", body, kind)
    assert got == status and re.search(said, answer["detail"]) and "\n" not in answer["detail"]
    got, answer = _send(f"{server}/predict", _png(1), "raw")
    assert got == 200 and len(answer["predictions"]) == 4  # the run's four classes, top 5


@pytest.mark.slow  # a server of its own, started and stopped: ~15 s
def test_sigterm_stops_the_server(checkpoint):
    process, url = _start(checkpoint)
    assert _send(f"{url}/predict", _png(2), "raw")[0] == 200
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    with pytest.raises(OSError):
        _get(f"{url}/health")


def test_a_model_without_a_head_or_a_missing_file_is_one_line(tmp_path):
    from tests.helpers import tiny_config
    from vit.checkpoint import Loaded
    from vit.cli.export import to_safetensors
    from vit.cli.serve import main
    from vit.model import VisionTransformer

    with pytest.raises(SystemExit, match=r"^error: .*missing\.ckpt"):
        main(["--checkpoint", str(tmp_path / "missing.ckpt")])
    features = tmp_path / "features.safetensors"
    to_safetensors(
        Loaded(VisionTransformer(tiny_config(num_classes=0)), (0.5,) * 3, (0.5,) * 3, None, features), features
    )
    with pytest.raises(SystemExit, match=r"^error: .*features\.safetensors: the model has no classification head"):
        main(["--checkpoint", str(features)])


@pytest.mark.slow  # an ONNX export and a server of its own: ~20 s
def test_the_onnx_runtime_serves_an_onnx_export_as_predict_answers_in_torch(checkpoint, tmp_path):
    """--runtime onnx with the checkpoint's .onnx export: the worker scores it in ONNX Runtime (the graph is all it
    has: no torch weights), batched, and answers what predict answers in torch, within float rounding."""
    pytest.importorskip("onnxruntime")
    from vit.cli.export import main as export

    graph = tmp_path / "m.onnx"
    export(["--checkpoint", checkpoint, "--format", "onnx", "--out", str(graph)])
    process, url = _start(str(graph), "--runtime", "onnx", "--max-batch-size", "8", "--batch-timeout", "0.05")
    try:
        loaded = load(checkpoint)
        images = [_png(seed, (16 + seed % 5, 16 + seed % 3)) for seed in range(16)]
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda k: _send(f"{url}/predict", images[k], "raw"), range(16)))
        for data, (status, body) in zip(images, answers, strict=True):
            assert status == 200, body
            expected = _as_predict_answers(loaded, data)
            assert [p["class"] for p in body["predictions"]] == [name for name, _ in expected]
            probabilities = [p["probability"] for p in body["predictions"]]
            np.testing.assert_allclose(probabilities, [p for _, p in expected], atol=1e-4, rtol=0)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
