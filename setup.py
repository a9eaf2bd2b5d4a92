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
    python_requires='>=3.8',
    install_requires=[
        'mmengine>=0.10,<1',
        'mmdet>=3.3,<3.4',
        'mmcv>=2.0.0,<2.2.0',
        'torch',
        'tensorboard',
    ],
    extras_require={
        'tests': ['pytest', 'pytest-timeout', 'pytest-xdist', 'psutil'],
    },
    zip_safe=False,
)
