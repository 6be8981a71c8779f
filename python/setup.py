"""The wheel carries libkvxfer.so, a native library: tag it for this
platform (py3-none-linux_ARCH), not as pure Python. Everything else is in
pyproject.toml."""

from setuptools import setup

try:  # setuptools >= 70 ships bdist_wheel itself
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # older: the wheel package's
    from wheel.bdist_wheel import bdist_wheel


class platform_wheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(cmdclass={"bdist_wheel": platform_wheel})
