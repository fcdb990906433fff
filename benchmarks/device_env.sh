# Sourced by the H200 run scripts: the wheels of benchmarks/device_wheels.sh (carried in
# .whl/) installed into /tmp/site, again whenever the set of wheels changed (a warm machine
# keeps /tmp/site between calls), and the Python path that finds them and this checkout.
if [ -d .whl ]; then
  stamp=$(ls .whl | md5sum | cut -d' ' -f1)
  if [ "$(cat /tmp/site/.wheels 2>/dev/null)" != "$stamp" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
    echo "$stamp" > /tmp/site/.wheels
  fi
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
