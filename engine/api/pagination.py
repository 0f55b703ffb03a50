"""Pagination of job lists."""

from __future__ import annotations

from rest_framework.pagination import PageNumberPagination

#: The rows of a page, in the API's lists and on the dashboard's pages alike.
PAGE_SIZE = 50


class JobPagination(PageNumberPagination):
    page_size = PAGE_SIZE
    page_size_query_param = "pageSize"
    max_page_size = 500
