"""Grammar settings shared by structured outputs and tool-call grammars (no torch here, so the
chat template, which renders tool schemas, stays light to import)."""

# JSON may put whitespace between its tokens, but at most this much in one place: unbounded,
# a model that prefers newlines (a small or untrained one) wrote them until max_tokens and
# never closed the object; 16 characters still allow pretty-printing 7 levels deep
JSON_OPTIONS = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{0,16}"}
