"""GLM chat format: render conversations, encode them to ids + loss masks, parse model output (whole or streamed).

    from glmstack.chat import render, encode, parse, StreamParser
    text = render(messages, tools, style="glm-4.7", add_generation_prompt=True)
    ids, loss_mask = encode(tokenizer, messages, tools, style="glm-4.7")
    message = parse(completion, tools, style="glm-4.7")   # OpenAI assistant message

Styles: "glm-4.5" (GLM-4.5/4.6 template) and "glm-4.7" (GLM-4.7/GLM-5). GLM-5's thinking modes (interleaved,
preserved, turn-level) as training examples: glmstack.chat.modes. See docs/chat.md.
"""

from glmstack.chat.encode import encode, encode_segments
from glmstack.chat.parse import parse
from glmstack.chat.render import STYLES, Segment, render, render_segments
from glmstack.chat.stream import StreamParser, accumulate

__all__ = [
    "STYLES", "Segment", "StreamParser", "accumulate", "encode", "encode_segments", "parse", "render",
    "render_segments",
]  # fmt: skip
