"""The engines: the OpenAI engine's overhead and limits, vLLM and llama.cpp, and the decode-step
cost model they are priced by."""
