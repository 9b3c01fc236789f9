"""The companion controller. The only package that imports kopf, and only from ``command`` onward."""
