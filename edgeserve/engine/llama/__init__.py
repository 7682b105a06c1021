"""The llama.cpp backend: everything that calls llama.cpp, handed its sizes by the engine."""
