"""The engine host: llama.cpp in a child process, so its aborts and crashes end that process only."""
