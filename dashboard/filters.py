"""The dashboard's filters and pages through the API's FilterSets and page size
(engine.api.filters, engine.api.pagination): a value means the same on a page as in the API. A
page never refuses a value: the API answers 400, a page drops it (shows and links without it)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django_filters import FilterSet

from engine.api.pagination import PAGE_SIZE


def accepted(filterset: type[FilterSet], query: Mapping, names: Iterable[str]) -> dict[str, str]:
    """The values of ``names`` in ``query`` (a request's QueryDict or the live socket's dict),
    each one the FilterSet refuses replaced by ``""``."""
    values = {name: str(query.get(name, "")) for name in names}
    form = filterset(values).form
    form.is_valid()
    return {name: "" if name in form.errors else value for name, value in values.items()}


def filtered(filterset: type[FilterSet], values: Mapping[str, str], queryset) -> QuerySet:
    """``queryset`` filtered by ``values`` (blank ones filter nothing)."""
    return filterset(dict(values), queryset=queryset).qs


def page_of(queryset, number) -> Page:
    """One page of ``queryset`` in the API's page size (an unknown ``number``: the nearest)."""
    return Paginator(queryset, PAGE_SIZE).get_page(number)
