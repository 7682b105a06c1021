"""The wire APIs, one package each (see README "Layout"): wire models, translation into engine
requests with every client-error check, renderers and routes. Nothing here imports aiohttp: the
HTTP layer (edgeserve.http) mounts each package's `ROUTES`."""
