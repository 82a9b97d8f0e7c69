"""The Ray Serve application: gateway, router, lanes (fast, priority, standard) and gRPC."""
