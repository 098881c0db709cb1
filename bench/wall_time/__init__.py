"""Wall time: a job's latency on a replay engine priced like a GPU, online clients through
the OpenAI SDK, stragglers cut."""
