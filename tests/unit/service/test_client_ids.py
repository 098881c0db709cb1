"""Who a request's client is: the API key it authenticated with, else a configured header."""

from blendserve.scheduler.pool import SHARED_CLIENT
from blendserve.service.security import ClientIds
from starlette.datastructures import Headers


def _headers(**values: str) -> Headers:
    return Headers({name.replace("_", "-"): value for name, value in values.items()})


def test_with_api_keys_each_key_is_a_client_whose_id_tells_nothing_of_the_key() -> None:
    ids = ClientIds(keyed=True, header="x-client")
    one = ids.of(_headers(authorization="Bearer sk-secret-one"))
    assert one == ids.of(_headers(authorization="bearer  sk-secret-one "))
    assert one != ids.of(_headers(authorization="Bearer sk-secret-two"))
    assert "secret" not in one and len(one) <= 24
    # A header cannot make a client of a key another client, nor split it.
    assert ids.of(_headers(authorization="Bearer sk-secret-one", x_client="other")) == one
    # Another process (another secret) gives the same key another id.
    assert ClientIds(keyed=True).of(_headers(authorization="Bearer sk-secret-one")) != one


def test_an_open_service_names_clients_by_its_header_or_shares_one() -> None:
    named = ClientIds(keyed=False, header="X-Client")
    alice = named.of(_headers(x_client="alice"))
    assert alice == named.of(_headers(x_client="alice", authorization="Bearer a"))
    assert alice not in (named.of(_headers(x_client="bob")), SHARED_CLIENT)
    assert "alice" not in alice
    assert named.of(_headers()) == SHARED_CLIENT
    # Without a header setting, every request is the one shared client, whatever its key.
    shared = ClientIds(keyed=False)
    assert shared.of(_headers(authorization="Bearer a", x_client="alice")) == SHARED_CLIENT


def test_a_header_sent_twice_names_no_client() -> None:
    """Which of two would count? The key check refuses them; the id reads neither."""
    twice = Headers(raw=[(b"authorization", b"Bearer one"), (b"authorization", b"Bearer two")])
    assert ClientIds(keyed=True).of(twice) == SHARED_CLIENT
    named = ClientIds(keyed=False, header="X-Client")
    both = Headers(raw=[(b"x-client", b"alice"), (b"x-client", b"bob")])
    assert named.of(both) == SHARED_CLIENT
