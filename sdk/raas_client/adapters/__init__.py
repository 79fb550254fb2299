"""Adapters from RL frameworks to raas: the framework's own rollout interface, run by raas.

- `raas_client.adapters.verl`: `RaasAgentLoop`, a verl agent loop (`AgentLoopBase`,
  registered as `raas`) returning verl's `AgentLoopOutput`; `pip install 'raas-client[verl]'`.
- `raas_client.adapters.skyrl`: `RaasGenerator`, a SkyRL generator (`GeneratorInterface`)
  returning SkyRL's `GeneratorOutput`; `pip install 'raas-client[skyrl]'`.

Both import their framework only when imported themselves; `rows` holds what they share
(reading a finished rollout row into ids, masks, logprobs and reward; the failure rule).
"""
