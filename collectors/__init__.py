"""Collectors: talk to a server or its files and write the dspark-obs store."""
