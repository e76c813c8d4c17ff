"""Every table and line ``gpudays`` prints on the terminal."""
