"""SASL on the producer's side: the RFC test vectors, proofs that must fail, PLAIN."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wallaroo_proto.protocols.dcp.sasl import Account, AuthFailed, ScramClient, ScramServer, choose

PENCIL = Account("user", "pencil")


def test_scram_sha1_gives_rfc_5802s_server_first_and_signature():
    """RFC 5802 section 5: the exchange for user "user", password "pencil"."""
    s = ScramServer(
        PENCIL, "SCRAM-SHA1", nonce="3rfcNHYJY1ZVvWVs7j", salt=base64.b64decode("QSXCR+Q6sek8bf92")
    )
    first = s.first(b"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL")
    assert first == b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096"
    final = s.final(b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=")
    assert final == b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ="


def test_scram_sha256_gives_rfc_7677s_server_first_and_signature():
    """RFC 7677 section 3."""
    s = ScramServer(
        PENCIL,
        "SCRAM-SHA256",
        nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
        salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="),
    )
    first = s.first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = s.final(
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _sha1_exchange(account: Account, final: bytes) -> bytes:
    s = ScramServer(
        account, "SCRAM-SHA1", nonce="3rfcNHYJY1ZVvWVs7j", salt=base64.b64decode("QSXCR+Q6sek8bf92")
    )
    s.first(b"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL")
    return s.final(final)


@pytest.mark.parametrize(
    "final",
    [
        b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=w0X8v3Bz2T0CJGbJQyF0X+HI4Ts=",  # proof off
        b"c=biws,r=fyko+d2lbbFgONRv9qkxdawLXXXX,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=",  # another nonce
        b"c=eSws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=",  # binding y,,
        b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j",  # no proof
        b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=!!!",
    ],
)
def test_a_wrong_scram_final_message_fails(final):
    with pytest.raises(AuthFailed):
        _sha1_exchange(PENCIL, final)


def test_the_right_proof_for_another_password_fails():
    with pytest.raises(AuthFailed, match="wrong user or password"):
        _sha1_exchange(
            Account("user", "pencil2"),
            b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=",
        )


def test_plain_checks_user_and_password():
    assert PENCIL.plain(b"\0user\0pencil") == "user"
    for bad in (b"\0user\0pencil!", b"\0root\0pencil", b"user\0pencil"):
        with pytest.raises(AuthFailed):
            PENCIL.plain(bad)


@given(st.binary(max_size=200), st.binary(max_size=200))
def test_any_bytes_give_a_server_first_or_auth_failed(first, final):
    s = ScramServer(PENCIL, "SCRAM-SHA512")
    try:
        s.first(first)
        s.final(final)
    except AuthFailed:
        pass


# ------------------------------------------------------------------------------ the client's side


@pytest.mark.parametrize(
    "mechanism, nonce, server_first, client_final, server_final",
    [
        (  # RFC 5802 section 5
            "SCRAM-SHA1",
            "fyko+d2lbbFgONRv9qkxdawL",
            b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096",
            b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=",
            b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ=",
        ),
        (  # RFC 7677 section 3
            "SCRAM-SHA256",
            "rOprNGfwEbeRWgbNEkqO",
            b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
            b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
            b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
            b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
        ),
    ],
)
def test_the_client_gives_the_rfcs_proofs_and_checks_their_server_signatures(
    mechanism, nonce, server_first, client_final, server_final
):
    c = ScramClient("user", "pencil", mechanism, nonce=nonce)
    assert c.first() == f"n,,n=user,r={nonce}".encode()
    assert c.final(server_first) == client_final
    c.verify(server_final)
    with pytest.raises(AuthFailed, match="signature is wrong"):
        c.verify(server_final[:-6] + b"AAAAA=")


def test_the_client_refuses_a_server_nonce_that_does_not_extend_its_own():
    c = ScramClient("user", "pencil", "SCRAM-SHA512", nonce="abc")
    with pytest.raises(AuthFailed, match="nonce"):
        c.final(b"r=xyz123,s=QSXCR+Q6sek8bf92,i=4096")


def test_the_client_picks_the_strongest_mechanism_offered():
    assert choose(["PLAIN", "SCRAM-SHA1", "SCRAM-SHA512"]) == "SCRAM-SHA512"
    assert choose(["PLAIN"]) == "PLAIN" and choose(["OAUTHBEARER"]) is None
