"""Pure-torch reference implementations of every kernel: the CPU path and the tests' oracle."""
