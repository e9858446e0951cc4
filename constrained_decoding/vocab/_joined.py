"""All of a vocabulary's token bytes in one numpy buffer, shared by the passes that read
every token's bytes: the `Vocabulary` fingerprint (which joins them anyway, so a
vocabulary's first compile finds them ready), and the host passes that walk tokens in
lockstep (`automata/_registers`: which tokens cross a register operation and where;
`automata/_unique_strings`: each token's string hash).

Joining Gemma 3's 262,144 tokens (1.97 MB) takes ~20-30 ms of CPU (a Python-level pass
per token); done once per vocabulary and process here instead of once per user.
"""

import numpy as np

# id(token_bytes) -> (token_bytes, joined arrays), for the last few vocabularies (the
# object is kept too, so that its id stays its own).
_JOINED: dict[int, tuple] = {}
_JOINED_SIZE = 4


def joined(token_bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(uint8 all token bytes concatenated, int64 start and end of each token's; None and
  b"" tokens are empty), read-only and shared: computed once per vocabulary object."""
  cached = _JOINED.get(id(token_bytes))
  if cached is None or cached[0] is not token_bytes:
    lengths = np.array([len(b or b"") for b in token_bytes], np.int64)
    ends = np.cumsum(lengths)
    data = np.frombuffer(b"".join(b or b"" for b in token_bytes), np.uint8)
    starts = ends - lengths
    for a in (ends, starts):
      a.setflags(write=False)  # (`data` is a read-only view of bytes already.)
    if len(_JOINED) >= _JOINED_SIZE:
      _JOINED.pop(next(iter(_JOINED)))
    cached = _JOINED[id(token_bytes)] = (token_bytes, (data, starts, ends))
  return cached[1]
