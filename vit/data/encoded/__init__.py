"""The sources of encoded images (image folders, Hugging Face datasets, shards), one base and one policy for
decoding, transforms and bad images. Nothing is imported here, so that the config can count classes and the loader
can read images without Lightning."""
