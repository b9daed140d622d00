"""`plan.compare.differs`: when the operator applies a child again (issue 41: an empty list against the API server's
null)."""

from __future__ import annotations

from triton_operator.plan.compare import differs


def test_an_empty_list_the_operator_sets_is_held_by_a_null_or_missing_field() -> None:
    """An EndpointSlice with no endpoint reads back `"endpoints": null` from the API server: the same object, not a
    change (otherwise each pool round applied it again). A non-empty list is still a change, and so is a null where
    the operator sets a value."""
    desired = {"addressType": "IPv4", "endpoints": [], "metadata": {"labels": {}}}
    assert not differs({"addressType": "IPv4", "endpoints": None, "metadata": {"labels": None}}, desired)
    assert not differs({"addressType": "IPv4", "metadata": {}}, desired)
    assert differs({"addressType": "IPv4", "endpoints": None, "metadata": {}},
                   {**desired, "endpoints": [{"addresses": ["198.18.160.9"]}]})
    assert differs({"addressType": None, "endpoints": [], "metadata": {}}, desired)
