"""The servers the operator exposes on its TLS port: the admission webhook (`webhook`, with its own list+watch of
TritonModels, `informer`) and the aggregated custom metrics API (`custom_metrics`), behind one bounded TLS server
(`tls_server`).

Every operator replica serves them, leader or not. They stand on `platform` for the API server and on the pure
layers (`validate`, `plan`, `render`) for their answers; they import nothing of `controller`, which starts them.
"""
