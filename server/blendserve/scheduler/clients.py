"""A pool's clients: what each one's questions learn, and the keyer its answers take turns on."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from blendserve.core.online_rule import StreamLearning
from blendserve.core.price import PacedPrice
from blendserve.core.traces import TraceLearner
from blendserve.scheduler.spec import Keyer

__all__ = ["IDLE_CLIENT_S", "SHARED_CLIENT", "Client", "Clients"]

#: The client of questions that name none.
SHARED_CLIENT = ""
#: Seconds after which a client with no open question, not seen since, is forgotten
#: (its learning restarts if it comes back); the service drops a pool idle as long.
IDLE_CLIENT_S = 600.0


@dataclass(eq=False)
class Client:
    """One client of a pool: what its finished questions taught (``learning``: its price,
    paced to the pool's budget whatever other clients ask, its flatness and its prior), its
    ``keyer`` (its own turns at the sympy workers), its questions open now, and when it last
    asked or one of its questions ended (``seen``, :func:`time.monotonic`). ``traces``:
    what its traces taught (:mod:`blendserve.core.traces`)."""

    learning: StreamLearning
    keyer: Keyer
    traces: TraceLearner = field(default_factory=TraceLearner)
    num_open: int = 0
    seen: float = field(default_factory=time.monotonic)

    @property
    def price(self) -> PacedPrice:
        """The client's price, paced to the pool's budget (or fixed by its target)."""
        return self.learning.price

    def closed(self, _: object = None) -> None:
        """One of the client's questions ended (answered, or its caller left)."""
        self.num_open -= 1
        self.seen = time.monotonic()


class Clients:
    """The clients of one pool, made (by ``new``, given the name) when first asked for,
    least recently asked for first. A client with no open question is forgotten once not
    seen for ``idle_s`` seconds, or, beyond ``max_clients``, oldest first."""

    def __init__(self, new: Callable[[str], Client], max_clients: int, idle_s: float) -> None:
        self._new = new
        self.max_clients = max_clients
        self.idle_s = idle_s
        self._clients: OrderedDict[str, Client] = OrderedDict()

    def __len__(self) -> int:
        return len(self._clients)

    def __iter__(self) -> Iterator[str]:
        return iter(self._clients)

    def values(self) -> list[Client]:
        """The clients, least recently asked for first."""
        return list(self._clients.values())

    def get(self, name: str, now: float) -> Client:
        """``name``'s client (made if new), marked seen at ``now``."""
        self._forget_idle(now)
        client = self._clients.get(name)
        if client is not None:
            self._clients.move_to_end(name)
            client.seen = now
            return client
        for old_name, old in list(self._clients.items()):
            if len(self._clients) < self.max_clients:
                break
            if old.num_open == 0:
                del self._clients[old_name]
        client = self._clients[name] = self._new(name)
        client.seen = now
        return client

    def _forget_idle(self, now: float) -> None:
        """Forgets the clients with no open question not seen for ``idle_s``."""
        idle = []
        for name, client in self._clients.items():  # least recently asked for first
            if now - client.seen < self.idle_s:
                break
            if client.num_open == 0:
                idle.append(name)
        for name in idle:
            del self._clients[name]
