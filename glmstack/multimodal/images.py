"""Decode the images a user gives: files, bytes, base64 data URLs, PIL images (videos: glmstack.multimodal.video).

Why one place: the chat CLI (`--image FILE`), the server (OpenAI `image_url` content parts) and the SFT readers
all accept images from users, and bad input must read the same everywhere: one `ImageError` line naming the file
or part, never a PIL traceback. Remote URLs are refused (glmstack never reaches the network at run time).

    img = load_image("cat.png")                        # PIL.Image in RGB
    img = load_image("data:image/png;base64,iVBOR...")
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path

from glmstack.errors import GlmstackError

MAX_PIXELS = 64 * 1024 * 1024  # decompression-bomb guard: larger images are refused, not decoded


class ImageError(GlmstackError):
    """An image or video cannot be read; the message names the file, URL or content part."""


def load_image(source, *, what: str = "image"):
    """An RGB PIL image from a path, raw bytes, a `data:image/...;base64,` URL or a PIL image."""
    from PIL import Image

    if isinstance(source, Image.Image):
        return _checked(source, what).convert("RGB")
    if isinstance(source, (bytes, bytearray)):
        return _decode(bytes(source), what)
    if isinstance(source, Path) or (isinstance(source, str) and not _is_url(source)):
        path = Path(source)
        if not path.is_file():
            raise ImageError(f"{what}: {path}: no such file")
        return _decode(path.read_bytes(), f"{what} {path}")
    if isinstance(source, str) and source.startswith("data:"):
        return _decode(data_url_bytes(source, what), what)
    if isinstance(source, str):
        raise ImageError(f"{what}: remote URLs are not fetched ({source[:60]!r}); send the image as a data URL "
                         "(data:image/png;base64,...)")  # fmt: skip
    raise ImageError(f"{what}: expected a path, bytes, a data URL or a PIL image, got {type(source).__name__}")


def data_url_bytes(url: str, what: str = "image") -> bytes:
    """The payload of `data:<mime>;base64,<data>`."""
    head, sep, payload = url.partition(",")
    if not sep or not head.startswith("data:") or not head.endswith(";base64"):
        raise ImageError(f"{what}: a data URL must look like data:image/png;base64,<data>")
    if not head[5:].startswith("image/"):
        raise ImageError(f"{what}: the data URL's type is {head[5:-7] or 'empty'!r}, not an image")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"{what}: the data URL is not valid base64") from None


def to_data_url(image, fmt: str = "PNG") -> str:
    """A PIL image as a base64 data URL (what an OpenAI client sends)."""
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def _is_url(s: str) -> bool:
    return s.startswith(("data:", "http://", "https://", "ftp://", "file://", "s3://", "gs://"))


def _decode(data: bytes, what: str):
    from PIL import Image, UnidentifiedImageError

    bad = (UnidentifiedImageError, OSError, SyntaxError, Image.DecompressionBombError)
    try:
        img = Image.open(io.BytesIO(data))
    except bad as e:
        raise ImageError(f"{what}: not a readable image ({type(e).__name__}: {str(e)[:80]})") from None
    _checked(img, what)  # before decoding the pixels: a huge header is refused without allocating them
    try:
        return img.convert("RGB")
    except bad as e:
        raise ImageError(f"{what}: not a readable image ({type(e).__name__}: {str(e)[:80]})") from None


def _checked(img, what: str):
    w, h = img.size
    if w < 1 or h < 1 or w * h > MAX_PIXELS:
        raise ImageError(f"{what}: size {w}x{h} is outside 1 .. {MAX_PIXELS} pixels")
    return img
