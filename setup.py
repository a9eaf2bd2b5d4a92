from setuptools import find_packages, setup


def read_version():
    scope = {}
    with open('mmsafe/version.py', encoding='utf-8') as f:
        exec(f.read(), scope)
    return scope['__version__']


setup(
    name='mmsafe',
    version=read_version(),
    description='Safe dual-modality (visible + infrared) detection training '
    'for MMEngine / MMDetection 3.x',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    packages=find_packages(exclude=('tests', 'tests.*', 'configs', 'tools')),
    # The supported stack (README, "Supported versions"): torch 2.1 (what
    # OpenMMLab's prebuilt mmcv 2.1.0 wheels target) to the newest, numpy
    # 1.x and 2.x. Python >= 3.8 is what the code's syntax and standard
    # library need (measured with vermin) and where torch 2.1 starts.
    python_requires='>=3.8',
    install_requires=[
        'mmengine>=0.10,<1',
        'mmdet>=3.3,<3.4',
        'mmcv>=2.0.0,<2.2.0',
        'torch>=2.1',
        'numpy>=1.22,<3',
        'tensorboard',
    ],
    extras_require={
        'tests': ['pytest', 'pytest-timeout', 'pytest-xdist', 'psutil'],
    },
    zip_safe=False,
)
