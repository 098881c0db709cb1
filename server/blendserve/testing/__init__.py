"""Fakes and helpers for blendserve's tests and benchmarks; the service does not use them.

A fake OpenAI-compatible upstream (:mod:`~blendserve.testing.fake_openai`), a recording
stats sink (:mod:`~blendserve.testing.stats`), the service on a real uvicorn server in a
thread (:mod:`~blendserve.testing.live`) or as the ``blendserve serve`` command in a
subprocess (:mod:`~blendserve.testing.command`), hostile traffic and the upstream sample
accounting read from ``/metrics`` (:mod:`~blendserve.testing.abuse`,
:mod:`~blendserve.testing.accounting`), the cost model against a real engine
(:mod:`~blendserve.testing.cost_model`), vLLM as an outside process
(:mod:`~blendserve.testing.vllm`) and a poll with a deadline
(:mod:`~blendserve.testing.waiting`). They live in the package, outside ``tests/``, so
that the benchmarks import them as the tests do.

``import blendserve`` and the service never import this package. Its modules need the
``test`` extra's packages (httpx, the tests' and benchmarks' HTTP client): install
``blendserve[test]`` to use them.
"""
