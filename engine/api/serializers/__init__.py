"""API serializers, one module per resource (camelCase field names are the contract)."""
