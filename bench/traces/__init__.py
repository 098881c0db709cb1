"""Trace rules (DeepConf and blendserve's own): in the simulator, through the service, in the
engine, and what reading logprobs costs."""
