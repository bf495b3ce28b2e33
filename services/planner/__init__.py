"""The planner: every setup over the provider catalog that fits a plan, ranked by whole-job cost (pure)."""

from services.planner.constraints import Constraints
from services.planner.errors import PlannerError
from services.planner.models import PlannerResult, Recommendation, Rejection
from services.planner.planner import plan_setups

__all__ = ["Constraints", "PlannerError", "PlannerResult", "Recommendation", "Rejection", "plan_setups"]
