"""The close a trainer sends says whether the run is over (hostile input, old peers).

``Control("close", Closing(finished).to_args())``: finished, the workers go home;
not finished (SIGTERM, an error, a close before ``total_frames``), ``--reconnect``
workers wait for the next trainer. A close without the argument comes from a
trainer before it and means finished, as a close always did.
"""

from __future__ import annotations

import pytest

from asyncrl._protocol import Closing, Control
from transports import ProtocolError


@pytest.mark.parametrize("finished", [True, False])
def test_a_close_carries_whether_the_run_is_over(finished: bool) -> None:
    body = Control("close", Closing(finished).to_args()).to_body()
    assert Closing.from_args(Control.from_body(body).args) == Closing(finished)


@pytest.mark.parametrize("args", [{}, {"other": 1}, None])
def test_a_close_without_the_argument_means_finished_as_before(args) -> None:
    assert Closing.from_args(args).finished is True


@pytest.mark.parametrize("value", ["no", 0, 1, None, [False]])
def test_a_malformed_finished_is_refused_naming_the_field(value) -> None:
    with pytest.raises(ProtocolError, match="control close message field 'finished' must be bool"):
        Closing.from_args({"finished": value})
