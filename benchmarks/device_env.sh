# Sourced by the H200 run scripts: the wheels of benchmarks/device_wheels.sh (carried in
# .whl/) installed once per machine into /tmp/site, and the Python path that finds them
# and this checkout.
if [ -d .whl ] && [ ! -d /tmp/site/xgrammar ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
