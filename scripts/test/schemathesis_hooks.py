"""Schemathesis hooks for scripts/test/schemathesis: keep generated generation requests short.

The spec states what the server accepts (`max_tokens` up to 2^24, or absent: until the
end of generation or a full context). A test run cannot afford that many tokens per
example, so every generation request that is about to be sent with a token count the
server would honour gets it lowered to CAP (and one is added where none is given).
Counts the server refuses (0, negative, over 2^24, not an integer) are left alone: they
test the refusal and never generate.
"""

import schemathesis

CAP = 4
MAX_OUTPUT_TOKENS = 1 << 24

# The fields that bound how many tokens each generation route produces.
TOKEN_FIELDS = {
    "/v1/chat/completions": ("max_tokens", "max_completion_tokens"),
    "/v1/completions": ("max_tokens", "max_completion_tokens"),
    "/v1/messages": ("max_tokens",),
    "/v1/responses": ("max_output_tokens",),
}


def capped(value):
    """The value to send instead of `value` (None: leave the field as it is)."""
    if value is None:
        return CAP
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_OUTPUT_TOKENS:
        return min(value, CAP)
    return None


@schemathesis.hook
def before_call(context, case, kwargs):
    fields = TOKEN_FIELDS.get(case.operation.path)
    if not fields or not isinstance(case.body, dict):
        return
    for field in fields:
        new = capped(case.body.get(field))
        if new is not None:
            case.body[field] = new
