"""The API's routers, one per group of the seed's routes."""
