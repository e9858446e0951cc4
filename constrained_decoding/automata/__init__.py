"""Host side: IR -> pynini automata, the detokenizing FST, token-level composition."""
