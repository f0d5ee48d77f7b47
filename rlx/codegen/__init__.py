"""rlx.codegen"""

# CPU rules kept in their own modules register into table("cpu") here, so that importing any
# codegen module (the toolchain imports rlx.codegen.cpu.emit directly) leaves the table complete; doing
# it from c.py would make an import cycle (these modules build on c's emitter helpers).
import rlx.codegen.cpu.collectives
import rlx.codegen.cpu.decoder
import rlx.codegen.cpu.int8
import rlx.codegen.cpu.quant
import rlx.codegen.cpu.sample
import rlx.codegen.cpu.scan
import rlx.codegen.cpu.select
import rlx.codegen.cpu.ssm  # noqa: F401
