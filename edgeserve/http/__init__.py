"""The HTTP layer: the only package that imports aiohttp."""
