"""Images: the Docker Engine (daemon.py), the build context and the BuildKit build, base images
made offline, registries, the smoke payload run inside an image, the host preflight. The
mechanics; pipeline/ decides when each runs."""
