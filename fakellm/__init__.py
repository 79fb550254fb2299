"""The fake LLM inference server (a fake, named as such) for tests, benchmarks and the no-GPU demo.

A separate server process speaking vLLM's token-id subset: the scripted server (`server`), its
command line (`cli`, `raas llm-sim`), the continuous-batching capacity model (`capacity`), reply
latency distributions (`latency`), the weight-push endpoints (`weights`) and the demo policy
that solves `examples/math.jsonl` (`demo_policy`). Nothing in the product imports it except the
gateway CLI's `raas llm-sim` entry; the rollout path reaches it only over HTTP.
"""
